# Sourced by the run scripts under docs/results/ (not run on its own): the folders they work in and how they run
# a command, so each script runs from any clone, from any working directory.
#
#   ROOT      the repository (default: two folders above this file)
#   RESDECAY  the resdecay command (default ROOT/.venv/bin/resdecay, else resdecay on PATH)
#   PYTHON    the Python that has resdecay installed (default ROOT/.venv/bin/python, else python3)
#   DRY_RUN=1 or a --dry-run argument: print each command (and where its output would go) instead of running it
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
if [ -z "${RESDECAY:-}" ]; then
  if [ -x "$ROOT/.venv/bin/resdecay" ]; then RESDECAY=$ROOT/.venv/bin/resdecay; else RESDECAY=resdecay; fi
fi
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
DRY_RUN=${DRY_RUN:-0}
ARGS=()  # the script's arguments without --dry-run
for arg in "$@"; do
  if [ "$arg" = "--dry-run" ]; then DRY_RUN=1; else ARGS+=("$arg"); fi
done

# logged LOG CMD...: run CMD with its stdout and stderr in LOG (folder created); with --dry-run print it instead.
# Returns CMD's exit status.
logged() {
  local log=$1; shift
  if [ "$DRY_RUN" = 1 ]; then
    printf '%q ' "$@"; printf '> %q 2>&1\n' "$log"
    return 0
  fi
  mkdir -p "$(dirname "$log")"
  "$@" > "$log" 2>&1
}

# show CMD...: run CMD (output to the terminal); with --dry-run print it instead.
show() {
  if [ "$DRY_RUN" = 1 ]; then
    printf '%q ' "$@"; printf '\n'
    return 0
  fi
  "$@"
}

# wait_for PID...: wait until those processes have ended (not with --dry-run).
wait_for() {
  [ "$DRY_RUN" = 1 ] && return 0
  local pid
  for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 30; done; done
}

# claim DIR KEY: whether this worker takes queue item KEY. mkdir DIR/KEY is atomic, so of several workers sharing a
# queue exactly one takes each item (delete DIR before restarting after the workers died). With --dry-run every
# item is taken and nothing is created.
claim() {
  [ "$DRY_RUN" = 1 ] && return 0
  mkdir -p "$1" && mkdir "$1/$2" 2>/dev/null
}
