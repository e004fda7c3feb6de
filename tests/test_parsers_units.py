"""The one parser of values with a unit (``ds_bench.config.parsers``), on inline inputs (pure): counts (k, M, G
2^10-based, no byte unit), sizes in bytes (KiB/K binary, KB decimal), memory caps (a unit, at least 64 MiB) and
durations (a unit always). Each refusal is one ``UserError`` line naming the flag."""

from __future__ import annotations

import argparse

import pytest

from ds_bench.config import parsers
from ds_bench.errors import UserError


@pytest.mark.parametrize("text, value", [("8192", 8192), ("8k", 8192), ("8K", 8192), ("4M", 4 * 2**20),
                                         ("1G", 2**30), ("1.5k", 1536), (" 32 ", 32), ("1024", 1024)])
def test_a_count_takes_k_m_g_as_powers_of_two(text, value):
    assert parsers.parse_count("--seq-len", text) == value


@pytest.mark.parametrize("text, message", [
    ("4MB", "--global-batch '4MB': a count takes no byte unit; give 4M (= 4,194,304: k, M, G are 2^10-based) or a "
            "plain number such as 4000000"),
    ("8KiB", "--global-batch '8KiB': a count takes no byte unit; give 8k (= 8,192: k, M, G are 2^10-based) or a plain "
             "number such as 8000"),
    ("64B", "--global-batch '64B': a count takes no byte unit; give a plain number"),
    ("8q", "--global-batch '8q': expected a count such as 8192, 8k or 4M (k, M, G = 2^10, 2^20, 2^30)"),
    ("", "--global-batch '': expected a count such as 8192, 8k or 4M (k, M, G = 2^10, 2^20, 2^30)"),
    ("0.3k", "--global-batch '0.3k' is 307.2: expected a whole number"),
    ("0", "--global-batch must be a positive integer, got 0"),
    ("-2k", "--global-batch must be a positive integer, got -2k"),
])
def test_a_count_refuses_bytes_fractions_and_zero(text, message):
    with pytest.raises(UserError) as e:
        parsers.parse_count("--global-batch", text)
    assert str(e.value) == message


@pytest.mark.parametrize("text, value", [("8", 8), ("64B", 64), ("1KiB", 1024), ("1K", 1024), ("1KB", 1000),
                                         ("512MiB", 512 * 2**20), ("3G", 3 * 2**30), ("2GB", 2 * 10**9),
                                         ("1.5GiB", 3 * 2**29), ("1TiB", 2**40), ("1mb", 10**6)])
def test_a_size_binary_with_i_or_a_bare_letter_decimal_with_b(text, value):
    assert parsers.parse_bytes("--max-bytes", text) == value


@pytest.mark.parametrize("text, message", [
    ("lots", "--max-bytes 'lots': expected a size such as 4GiB, 512MiB, 64KB or a number of bytes (KiB, MiB, GiB and "
             "K, M, G are 2^10-based; KB, MB, GB 10^3-based)"),
    ("1e9", "--max-bytes '1e9': expected a size such as 4GiB, 512MiB, 64KB or a number of bytes (KiB, MiB, GiB and "
            "K, M, G are 2^10-based; KB, MB, GB 10^3-based)"),
    ("0", "--max-bytes '0': a size must be > 0"),
])
def test_a_size_refuses_what_is_not_one(text, message):
    with pytest.raises(UserError) as e:
        parsers.parse_bytes("--max-bytes", text)
    assert str(e.value) == message


def test_a_memory_cap_needs_a_unit_and_room_to_start():
    assert parsers.parse_memory("--cpu-mem-limit", "1.1GiB") == int(1.1 * 2**30)
    assert parsers.parse_memory("--cpu-mem-limit", "3221225472B") == 3 * 2**30  # a study's jobs get bytes this way
    assert parsers.parse_memory("--cpu-mem-limit", "64MiB") == parsers.MIN_MEMORY_BYTES
    with pytest.raises(UserError) as bare:
        parsers.parse_memory("--cpu-mem-limit", "1.1")
    assert str(bare.value) == ("--cpu-mem-limit 1.1: give a unit, e.g. 1.1GiB or 1.1MiB (a bare number is not taken "
                               "as bytes)")
    with pytest.raises(UserError) as tiny:
        parsers.parse_memory("--device-memory", "63MiB")
    assert str(tiny.value) == ("--device-memory '63MiB' is 66,060,288 bytes: below 64 MiB no rank starts; give e.g. "
                               "4GiB")


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("15m", 900), ("1.5h", 5400), ("1d", 86400), ("0.3s", 0.3),
                                           ("2M", 120), (" 20m ", 1200)])
def test_a_duration_takes_s_m_h_d(text, seconds):
    assert parsers.parse_duration("--timeout", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, message", [
    ("20", "--timeout 20: give a unit, e.g. 20s or 20m (s, m, h, d)"),
    ("1w", "--timeout '1w': expected a duration such as 90s, 15m, 1h or 1d"),
    ("inf", "--timeout 'inf': expected a duration such as 90s, 15m, 1h or 1d"),
    ("20ms", "--timeout '20ms': expected a duration such as 90s, 15m, 1h or 1d"),
    ("0s", "--timeout '0s': must be at least 1 ms"),
    ("-5m", "--timeout '-5m': must be at least 1 ms"),
    ("0.0000001s", "--timeout '0.0000001s': must be at least 1 ms"),  # it would print as 0s to a job, which refuses it
])
def test_a_duration_without_its_unit_is_refused(text, message):
    with pytest.raises(UserError) as e:
        parsers.parse_duration("--timeout", text)
    assert str(e.value) == message


def test_a_flag_type_gives_argparse_the_value_and_the_flags_own_line():
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=parsers.flag_type(parsers.parse_count, "--seq-len"))
    p.add_argument("--step-timeout", type=parsers.flag_type(parsers.parse_duration, "--step-timeout"), default=1800.0)
    args = p.parse_args(["--seq-len", "8k"])
    assert (args.seq_len, args.step_timeout) == (8192, 1800.0)
    with pytest.raises(UserError, match=r"^--step-timeout 20: give a unit"):
        p.parse_args(["--step-timeout", "20"])


def test_a_list_of_counts_parses_each_item():
    assert parsers.parse_list("--seq-len", "1k,4k,1024", kind=parsers.flag_type(parsers.parse_count, "--seq-len")) == (
        1024, 4096)


@pytest.mark.parametrize("seconds", [900.0, 0.5, 30 * 86400.0, 1e7, 90.25])
def test_a_studys_timeout_goes_to_its_jobs_as_a_duration_they_read_back(seconds):
    """``jobs.runner`` hands each job ``--step-timeout`` = the study's ``--timeout``: no exponent, a unit."""
    text = parsers.duration_text(seconds)
    assert text.endswith("s") and "e" not in text
    assert parsers.parse_duration("--step-timeout", text) == pytest.approx(seconds)


def test_a_studys_job_takes_its_timeout_and_cap_with_their_units():
    """What a study sets on each job's ``ds-bench run`` reads back through ``run``'s own parser."""
    from types import SimpleNamespace

    from ds_bench.config.run_flags import parse_run_tail
    from ds_bench.jobs import runner

    spec = SimpleNamespace(workload="mnist", runs_path="r.jsonl", steps=3, warmup=1, timeout_s=30 * 86400.0,
                           cpu_mem_limit=int(1.1 * 2**30), run_args=())
    flags, _ = parse_run_tail(runner.run_argv(spec, "tag", "c.json")[1:], [])
    assert (flags.step_timeout_s, flags.cpu_mem_limit) == (30 * 86400.0, int(1.1 * 2**30))
