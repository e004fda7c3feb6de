"""The performance model (``ds_bench.perf``) on inline inputs: the shapes' counts equal the workloads' own, the
activation formula is Korthikanti et al.'s, the step's parts (bubble, ZeRO's volumes, TP's all-reduces, group
placement, overlap) are the documented equations, the search drops with the rule's sentence or the excess, and
``--calibrate``'s records replace the datasheet's figures."""

from __future__ import annotations

import dataclasses

import pytest

from ds_bench.config.layout import Layout
from ds_bench.perf import calibrate, memory, shapes, space, step
from ds_bench.perf.bus_bytes import bus_bytes_per_step
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.datasheet import cluster_of
from ds_bench.perf.devices import cpu_cluster
from ds_bench.record.schema import CommRecord, CommRow, RooflineRecord, RooflineRow
from ds_bench.workloads import REGISTRY, flops, gpt2_shapes, llama_shapes, moe_shapes


def layout(**kw) -> Layout:
    return Layout(**{"stage": 1, "offload": "none", "precision": "bf16", "micro_batch": 1, **kw})


@pytest.mark.parametrize("size", list(gpt2_shapes.SHAPES))
def test_gpt2_counts_are_the_workloads(size):
    t = shapes.of_workload("gpt2", size, None, None, None, 1024)
    s = gpt2_shapes.named_shape(size, 1024)
    assert t.params == gpt2_shapes.gpt2_param_count(s.n_layer, s.n_embd, positions=s.n_positions)
    assert t.flops_per_token(1024) == flops.gpt2_flops_per_token(s.n_layer, s.n_embd, 4 * s.n_embd,
                                                                 gpt2_shapes.VOCAB, 1024)
    assert t.flops_per_token(1024, recompute=True) == pytest.approx(
        flops.gpt2_hardware_flops_per_token(s.n_layer, s.n_embd, 4 * s.n_embd, gpt2_shapes.VOCAB, 1024))


@pytest.mark.parametrize("size", list(llama_shapes.SHAPES))
def test_llama_counts_are_the_workloads(size):
    t, s = shapes.of_workload("llama", size, None, None, None, 4096), llama_shapes.SHAPES[size]
    assert t.params == llama_shapes.param_count(s)
    assert t.flops_per_token(4096) == llama_shapes.flops_per_token(s, 4096)
    assert t.flops_per_token(4096, True) == pytest.approx(llama_shapes.hardware_flops_per_token(s, 4096))


@pytest.mark.parametrize("size", list(moe_shapes.SHAPES))
def test_moe_counts_are_the_workloads(size):
    t, s = shapes.of_workload("moe", size, None, None, None, 2048), moe_shapes.SHAPES[size]
    assert (t.params, t.expert_params) == (moe_shapes.param_count(s), moe_shapes.expert_param_count(s))
    assert t.flops_per_token(2048) == moe_shapes.flops_per_token(s, 2048)
    assert t.largest_layer_params == moe_shapes.largest_layer_params(s)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_a_gpt_block_keeps_korthikantis_bytes(tp):
    """Korthikanti et al. 2022, eq. 1-2: s b h (10 + 24/t + 5 a s / (h t)) bytes per block in 16-bit with dropout
    (Megatron's GPT; ds-bench's GPT-2 trains without)."""
    gpt = dataclasses.replace(shapes.of_workload("gpt2", "small", None, None, None, 1024), dropout=True)
    s, b, h, a = 1024, 4, gpt.hidden, gpt.heads
    got = memory.block_bytes(gpt, Candidate(layout(micro_batch=b, tensor_parallel=tp)), s, eager=True)
    assert got == pytest.approx(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))
    fused = memory.block_bytes(gpt, Candidate(layout(micro_batch=b, tensor_parallel=tp)), s, eager=False)
    assert fused == pytest.approx(s * b * h * (10 + 24 / tp))


def test_a_block_without_dropout_keeps_two_bytes_less_per_token_and_unit_and_a_tiled_mlp_keeps_no_intermediates():
    """Korthikanti's 10 + 24/t of a 16-bit GPT block, less its two 1-byte dropout masks (MPT, Llama: no dropout);
    DeepSpeed's TiledMLP recomputes the MLP's 16 bytes (two 4h tensors: GELU's input and output) in backward."""
    gpt = shapes.of_workload("gpt2", "small", None, None, None, 1024)
    plain = dataclasses.replace(gpt, dropout=False)
    assert not gpt.dropout  # ds-bench's GPT-2 is built without dropout (workloads.gpt2.shape_config)
    s, b, h = 1024, 4, gpt.hidden
    assert memory.block_bytes(plain, Candidate(layout(micro_batch=b)), s, eager=False) == pytest.approx(s * b * h * 32)
    tiled = Candidate(layout(micro_batch=b, tiled_mlp=True))
    assert memory.block_bytes(plain, tiled, s, eager=False) == pytest.approx(s * b * h * 16)
    assert gpt.flops_per_token(s, tiled_mlp=True) - gpt.flops_per_token(s) == 2 * gpt.layers * 2 * h * 4 * h


def test_the_loss_holds_12_bytes_a_logit_upcast_2e_fused_and_one_tile_tiled():
    """``perf.loss_memory``: HF's upcast loss keeps three fp32 [tokens x vocab] tensors, a fused kernel the logits
    and their gradient in the compute precision; plan's logits term is that, over a TP rank's share of the vocab."""
    from ds_bench.perf import loss_memory

    assert loss_memory.loss_bytes(1000, 50_000, "bf16") == 1000 * 50_000 * 12
    assert loss_memory.loss_bytes(1000, 50_000, "bf16", "fused") == 1000 * 50_000 * 4
    assert loss_memory.loss_bytes(1000, 50_000, "fp32", "fused") == 1000 * 50_000 * 8
    assert loss_memory.loss_bytes(65_536, 128_256, "bf16", "fused", tiled=True) < 2 ** 30  # tiles: upcast, small
    gpt = shapes.of_workload("gpt2", "small", None, None, None, 1024)
    c = Candidate(layout(micro_batch=4, tensor_parallel=2))
    assert memory.logits_bytes(gpt, c, 1024, "fused") == 4 * 1024 * -(-gpt.vocab // 2) * 4


def test_checkpointing_keeps_each_blocks_input_and_one_block_and_its_gradients():
    gpt = shapes.of_workload("gpt2", "small", None, None, None, 1024)
    c = Candidate(layout(micro_batch=2), checkpointing=True)
    one = memory.block_bytes(gpt, c, 1024, eager=False)
    gradients = 2 * 2 * 1024 * (gpt.hidden + gpt.ffn)  # E tau (h + f): the residual's and the MLP's
    assert memory.backward_bytes(gpt, c, 1024) == gradients
    assert memory.activation_bytes(gpt, c, 1024) == int(gpt.layers * 2 * 2 * 1024 * gpt.hidden + one + gradients)


def test_a_balanced_pipeline_bubble_is_p_minus_1_over_m_of_the_compute():
    """Narayanan et al. 2021: with the LM head costing nothing (vocabulary 0) stages are balanced."""
    flat = dataclasses.replace(shapes.custom("flat", 8, 1024, 16, vocab=0, seq_len=1024), positions=0)
    cluster = cluster_of("H100", 1, 8, "bf16")
    for p, m in ((2, 4), (4, 8), (8, 8)):
        c = Candidate(layout(stage=0, pipeline_stages=p, micro_batch=1, grad_accum=m))
        st = step.step(flat, c, 1024, m * 8 // p, cluster)
        assert st.bubble_s / st.compute_s == pytest.approx((p - 1) / m)


def test_the_last_stage_carries_the_head():
    gpt = shapes.of_workload("gpt2", "tiny", None, None, None, 256)
    share = step.busiest_stage_share(gpt, 2, 256, False)
    head = 6 * gpt.vocab * gpt.hidden / gpt.flops_per_token(256)
    assert share == pytest.approx(head + (1 - head) / 2)


def test_data_parallel_bytes_are_zeros_volumes_over_the_dp_group():
    llama = shapes.of_workload("llama", "llama3.1-8b", None, None, None, 4096)
    cluster = cluster_of("H100", 2, 8, "bf16")
    for stage in range(4):
        c = Candidate(layout(stage=stage, tensor_parallel=2, micro_batch=1, grad_accum=4))
        moved = step.collectives(llama, c, 4096, 4, cluster)
        expected = bus_bytes_per_step(stage, int(llama.params / 2), 2, 2, 8, 4)
        assert {k: moved[k][0] for k in expected} == pytest.approx(expected)
        # every one of the 7 AutoTP all-reduces per block + 2, micro-batch x T x h, 2(t-1)/t on the bus, per micro-step
        assert moved["tp_all_reduce"][0] == pytest.approx((7 * 32 + 2) * 4096 * 4096 * 2 * 4)


def test_groups_inside_a_node_use_its_busbw_and_across_nodes_their_share_of_the_network():
    cluster = cluster_of("H100", 4, 8, "bf16")
    assert step.group(8, 1, cluster) == (8, False)
    assert step.group(4, 8, cluster) == (1, True)  # one rank a node
    assert step.group(32, 1, cluster) == (8, True)
    assert cluster.busbw("all_reduce", 8, False) == 480
    assert cluster.busbw("all_reduce", 1, True) == pytest.approx(cluster.nic_GBps)
    assert cluster.busbw("all_reduce", 8, True) == pytest.approx(min(480, 8 * cluster.nic_GBps))


def test_a_gb200_nvl72_group_across_hosts_stays_on_nvlink_inside_its_72_gpus():
    """GB200 NVL72: hosts of 4, one NVLink domain of 72 (18 hosts). A group of 8 (two hosts), or of the whole 72,
    runs at the domain's busbw; one of 144 (two racks) leaves it for the network. ``--nvlink-domain 4`` (hosts of 4
    on InfiniBand) sends the same group of 8 to the network."""
    from ds_bench.perf.devices import Cluster

    rack = cluster_of("GB200", 36, 4, "bf16")
    assert (rack.per_node, rack.domain, rack.nvlink_domain) == (4, 72, 72)
    assert step.group(8, 1, rack) == (4, False) and step.group(72, 1, rack) == (4, False)
    assert step.group(144, 1, rack) == (4, True)
    assert step.group(2, 72, rack) == (1, True)  # one rank in each rack
    hosts = cluster_of("GB200", 36, 4, "bf16", nvlink_domain=4)
    assert step.group(8, 1, hosts) == (4, True)
    assert Cluster.from_dict(rack.to_dict()).domain == 72
    llama = shapes.of_workload("llama", "llama3.1-70b", None, None, None, 8192)
    c = Candidate(layout(stage=1, tensor_parallel=8, micro_batch=1, grad_accum=8))
    on_nvlink, on_ib = (step.step(llama, c, 8192, 144, cl).exposed_s["tp_all_reduce"] for cl in (rack, hosts))
    assert on_ib / on_nvlink == pytest.approx(835 / (4 * rack.nic_GBps), rel=0.01)
    tp = space.degree_values(llama, rack, space.Space())["tensor_parallel"]
    assert 8 in tp and 72 in tp  # TP may span hosts inside the domain


def test_zero3_gathers_hide_behind_gpu_compute_but_not_on_cpu_ranks():
    llama = shapes.of_workload("llama", "llama3.2-1b", None, None, None, 2048)
    c = Candidate(layout(stage=3, micro_batch=4, grad_accum=2))
    gpu = step.step(llama, c, 2048, 64, cluster_of("H100", 1, 8, "bf16"))
    assert gpu.comm_s["all_gather"] > 0 and gpu.exposed_s["all_gather"] == 0
    cpu = cpu_cluster(1, 8, 2 ** 34, 0.1, {"all_reduce": 1.0}, 10.0, None, None)
    on_cpu = step.step(llama, c, 2048, 64, cpu)
    assert on_cpu.exposed_s == pytest.approx(on_cpu.comm_s)
    stage1 = step.step(llama, Candidate(layout(stage=1, micro_batch=4, grad_accum=2)), 2048, 64,
                       cluster_of("H100", 1, 8, "bf16"))
    assert stage1.exposed_s == stage1.comm_s  # reduced at the boundary, gathered after the step


def test_the_search_drops_with_the_rules_sentence_or_by_how_much_and_ranks_the_rest():
    from ds_bench.workloads import REGISTRY

    llama = shapes.of_workload("llama", "llama3.1-70b", None, None, None, 4096)
    cluster = cluster_of("H100", 2, 8, "bf16")
    ranked, dropped = space.search(llama, cluster, space.Space(), 4096, 256, REGISTRY["llama"])
    assert ranked and all(a.tokens_per_s_per_rank >= b.tokens_per_s_per_rank for a, b in zip(ranked, ranked[1:]))
    assert all(p.memory.total <= cluster.memory_bytes * 0.9 for p in ranked)
    rules = {d.rule: d for d in dropped}
    assert "AutoTP does not combine with DeepSpeed's pipeline engine" in rules["AutoTP and a pipeline"].why
    assert "gpt2 has" in rules["model"].why or "does not divide" in rules["model"].why
    over = rules["memory"]
    assert over.excess_bytes > 0 and "GiB over the 72.0 GiB usable" in over.why


def test_the_batch_must_divide_into_replicas_and_micro_batches():
    c = Candidate(layout(micro_batch=4))
    assert step.micro_steps(c, 64, 8) == 2 and step.micro_steps(c, 60, 8) is None


def test_records_replace_the_datasheets_figures():
    roof = RooflineRecord(kind="roofline", run_id="r1", time="t", results=[
        RooflineRow(rank=r, host="h", device="x86", test="matmul", dtype="fp32", size=n, median=v, low=v, high=v,
                    iters=1, repeats=1) for r, n, v in ((0, 512, 0.01), (0, 1024, 0.07), (1, 1024, 0.05))] + [
        RooflineRow(rank=0, host="h", device="x86", test="copy", dtype="fp32", size=1, median=12.0, low=1, high=1,
                    iters=1, repeats=1)])
    rows = [("intra-host", 8, 9.0), ("intra-host", 64, 20.0), ("world", 64, 6.0)]
    comm = CommRecord(kind="comm", status="ok", run_id="c1", time="t", world_size=4, hosts=["a", "a", "b", "b"],
                      results=[CommRow(scope=s, collective="all_reduce", size_bytes=n, busbw_GBps=b)
                               for s, n, b in rows])
    figures = calibrate.Figures()
    calibrate.from_roofline(roof, "fp32", figures)
    calibrate.from_comm(comm, figures)
    assert (figures.peak_tflops, figures.hbm_GBps, figures.device) == (pytest.approx(0.06), 12.0, "x86")
    assert figures.intra == {"all_reduce": 20.0} and figures.nic_GBps == 3.0  # world: 6 GB/s over 2 ranks a host
    assert figures.curves["intra:all_reduce"] == [[8.0, 9.0], [64.0, 20.0]]
    cpu = calibrate.apply(cpu_cluster(2, 2, 2 ** 33, 1.0, {"all_reduce": 1.0}, None, None, None), figures)
    assert (cpu.peak_tflops, cpu.intra_busbw_GBps["all_reduce"], cpu.nic_GBps) == (pytest.approx(0.06), 20.0, 3.0)
    assert cpu.sources["nic_GBps"].startswith("comm c1")
    assert cpu.busbw("all_reduce", 2, False, 8) == 9.0 and cpu.busbw("all_reduce", 2, False, 1 << 20) == 20.0
    inter = CommRecord(kind="comm", status="ok", run_id="c2", time="t", world_size=16, hosts=["a"] * 8 + ["b"] * 8,
                       results=[CommRow(scope="inter-host", collective="all_reduce", size_bytes=64, busbw_GBps=45.0)])
    one_per_host = calibrate.Figures()
    calibrate.from_comm(inter, one_per_host)
    assert one_per_host.nic_GBps == 45.0  # one rank a host: its busbw is one rank's share already


def test_a_gpus_measured_ceiling_keeps_its_rate_until_a_run_measures_one():
    h100 = cluster_of("H100", 1, 8, "bf16")
    figures = calibrate.Figures(peak_tflops=700.0)
    measured = calibrate.apply(h100, figures)
    assert measured.peak_tflops * measured.achieved == pytest.approx(h100.peak_tflops * h100.achieved)
    assert measured.mfu_peak_tflops == h100.peak_tflops
    ran = calibrate.apply(h100, calibrate.Figures(peak_tflops=700.0, run_tflops=350.0))
    assert ran.achieved == pytest.approx(0.5)


def test_dense_and_expert_gradients_each_move_at_their_groups_busbw():
    mixtral = shapes.of_workload("moe", "mixtral-8x7b", None, None, None, 4096)
    cluster = cluster_of("H100", 2, 8, "bf16")
    c = Candidate(layout(stage=1, expert_parallel=8, micro_batch=1, grad_accum=1))
    moved = step.collectives(mixtral, c, 4096, 1, cluster)
    dense = bus_bytes_per_step(1, mixtral.params - mixtral.expert_params, 2, 2, 16, 1)["reduce_scatter"]
    experts = bus_bytes_per_step(1, mixtral.expert_params // 8, 2, 2, 2, 1)["reduce_scatter"]
    inside = cluster.busbw("reduce_scatter", 8, True, 2 * mixtral.hidden ** 2)
    across = cluster.busbw("reduce_scatter", 1, True, 2 * mixtral.hidden ** 2)
    assert moved["reduce_scatter"][1] == pytest.approx(dense / (inside * 1e9) + experts / (across * 1e9))


def test_ulysses_degrees_the_kv_heads_do_not_fit_are_dropped():
    from ds_bench.workloads import REGISTRY

    llama = shapes.of_workload("llama", "llama3.2-3b", None, None, None, 3072)  # 24 heads, 8 KV heads
    why = space.model_reason(llama, layout(sequence_parallel=3), 3072, REGISTRY["llama"])
    assert why and "8 KV heads" in why
    assert space.model_reason(llama, layout(sequence_parallel=4), 3072, REGISTRY["llama"]) is None


def test_offloaded_states_must_fit_the_nodes_host_memory():
    """Llama 3.1 70B over 16 H100 at ZeRO-3: offloading the optimizer keeps 16 bytes a parameter of each rank's
    partition on its host (fp32 master, gradient, two moments), 8 ranks a node: 565 GB a node. With 2 TiB hosts
    those layouts are candidates; with 256 GiB they are dropped as ``host memory``, saying how much."""
    llama = shapes.of_workload("llama", "llama3.1-70b", None, None, None, 4096)
    s = space.Space(stages=(3,), offloads=("optimizer",), micro_batches=(1,), checkpointing=(True,),
                    degrees={"tensor_parallel": (1,), "pipeline_stages": (1,), "sequence_parallel": (1,)})
    roomy = cluster_of("H100", 2, 8, "bf16")
    ranked, _ = space.search(llama, roomy, s, 4096, 16, REGISTRY["llama"])
    assert ranked and ranked[0].memory.host * 8 == pytest.approx(16 * llama.params / 2, rel=1e-6)
    tight = dataclasses.replace(roomy, host_memory_bytes=256 * 2 ** 30)
    ranked, dropped = space.search(llama, tight, s, 4096, 16, REGISTRY["llama"])
    assert not ranked and {d.rule for d in dropped} == {"host memory"}
    assert "GiB to each node's host" in dropped[0].why


def test_the_checkpoint_offload_keeps_two_inputs_on_the_device_and_the_rest_on_the_host():
    """ALST's checkpoint offload: of the L checkpointed inputs (E tau h each), two stay on the device (the one in use,
    the one being copied) and L - 2 wait in host memory, where the node's ranks share them."""
    llama = shapes.of_workload("llama", "llama3.1-8b", None, None, None, 32768)
    cluster = cluster_of("H100", 1, 8, "bf16")
    ckpt = Candidate(layout(stage=3, micro_batch=1), checkpointing=True)
    offload = dataclasses.replace(ckpt, checkpoint_offload=True)
    one_input = 2 * 32768 * llama.hidden
    plain, moved = memory.memory(llama, ckpt, 32768, cluster), memory.memory(llama, offload, 32768, cluster)
    assert plain.activations - moved.activations == pytest.approx((llama.layers - 2) * one_input, abs=1)
    assert moved.host - plain.host == (llama.layers - 2) * one_input
    assert offload.label(8).endswith(" ckpt+offload") and offload.option_flags() == [
        "--activation-checkpointing", "--checkpoint-offload"]
