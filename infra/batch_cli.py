"""`sheshnag batch …`: a batch from a JSONL file to its output and error files in one command, configured the OpenAI
SDK's way (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, or `--base-url`, `--api-key`; without a base URL, the gateway and a
key of the stack `sheshnag up` runs from `--data-dir`, `SHESHNAG_DATA_DIR` or the default data dir).

`run IN.jsonl -o OUT.jsonl` uploads (progress in percent), creates, follows the batch's event stream with a live line
(status, lines done and failed, rate over the last 30 s, ETA: infra/batch_progress.py), prints what failed grouped
with line numbers and fixes, downloads both files and exits 0 when every line succeeded, 1 when some failed, 2 when
the batch did not complete. Ctrl-C asks whether to cancel the batch; otherwise it stops waiting and says how to
resume (`run batch_… -o OUT.jsonl`). `submit`, `status`, `wait`, `download`, `cancel`, `list` are the steps one at a
time.
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, get_args

import aiohttp

from contracts.api.batch import Placement
from contracts.api.error_codes import BatchErrorSummary
from infra.batch_key import NoLocalStack, chosen_data_dir, local_api_key, local_stack
from infra.batch_progress import Progress
from infra.batch_report import render_errors

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
ENDING_EVENTS = frozenset({"batch.completed", "batch.failed", "batch.validation_failed", "batch.expired",
                           "batch.cancelled"})
UPLOAD_CHUNK = 256 * 1024
EXIT_OK, EXIT_LINES_FAILED, EXIT_NOT_COMPLETED, EXIT_INTERRUPTED = 0, 1, 2, 130


class CliError(Exception):
    """A refusal to show as it is: the API's error message, or why the CLI cannot go on."""


@dataclass
class Config:
    base_url: str
    api_key: str


def config_from(args: argparse.Namespace, default_data_dir: Path) -> Config:
    """`--base-url`/`--api-key`; else, with `--data-dir`, that stack's; else `OPENAI_BASE_URL`/`OPENAI_API_KEY`; else
    the stack of `SHESHNAG_DATA_DIR` or the default data dir, with `OPENAI_API_KEY` when it is a Sheshnag key (`gk-`:
    an OpenAI key exported for OpenAI itself is never sent here), else the stack's own (infra/batch_key.py)."""
    data_dir = getattr(args, "data_dir", None)
    base_url = args.base_url or (None if data_dir else os.environ.get("OPENAI_BASE_URL"))
    if base_url:
        api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise CliError("No API key: set OPENAI_API_KEY or pass --api-key (the key `sheshnag up` printed, or one "
                           "from the dashboard's API keys page).")
        return Config(base_url.rstrip("/"), api_key)
    try:
        stack = local_stack(chosen_data_dir(data_dir, default_data_dir))
    except NoLocalStack as error:
        raise CliError(f"No base URL: {error}.") from None
    exported = "" if data_dir else os.environ.get("OPENAI_API_KEY", "")
    return Config(stack.base_url, args.api_key or (exported if exported.startswith("gk-") else local_api_key(stack)))


class BatchApi:
    """The few routes the CLI calls, with errors turned into `CliError` carrying the API's message."""

    def __init__(self, session: aiohttp.ClientSession, config: Config) -> None:
        self.session, self.config = session, config
        self.headers = {"Authorization": f"Bearer {config.api_key}"}

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        async with self.session.request(method, self.config.base_url + path, headers=self.headers,
                                        **kwargs) as answer:
            body = await answer.json(content_type=None) if answer.content_length != 0 else {}
            if answer.status >= 400:
                error = body.get("error") if isinstance(body, dict) else None
                message = error.get("message") if isinstance(error, dict) else await answer.text()
                code = f" ({error.get('code')})" if isinstance(error, dict) and error.get("code") else ""
                raise CliError(f"{method} {path}: {answer.status}{code}: {message}")
            return dict(body)

    async def upload(self, path: Path, size: int, out: TextIO) -> str:
        sent = 0
        last_shown = -1

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal sent, last_shown
            with path.open("rb") as source:
                while chunk := await asyncio.to_thread(source.read, UPLOAD_CHUNK):
                    sent += len(chunk)
                    percent = 100 * sent // size if size else 100
                    if percent != last_shown and (out.isatty() or percent in (0, 100) or percent % 25 == 0):
                        out.write(f"\r\x1b[2Kuploading {path.name}: {percent} %" if out.isatty()
                                  else f"uploading {path.name}: {percent} %\n")
                        out.flush()
                        last_shown = percent
                    yield chunk

        with aiohttp.MultipartWriter("form-data") as form:
            form.append("batch").set_content_disposition("form-data", name="purpose")
            part = form.append_payload(aiohttp.payload.AsyncIterablePayload(chunks()))
            part.set_content_disposition("form-data", name="file", filename=path.name)
            uploaded = await self._json("POST", "/files", data=form)
        if out.isatty():
            out.write("\n")
        return str(uploaded["id"])

    async def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None,
                     allow_partial: bool, placement: str = "approved_providers") -> dict[str, Any]:
        body: dict[str, Any] = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
        if metadata:
            body["metadata"] = metadata
        if allow_partial:
            body["allow_partial"] = True
        if placement != "approved_providers":
            body["placement"] = placement
        return await self._json("POST", "/batches", json=body)

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/batches/{batch_id}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self._json("POST", f"/batches/{batch_id}/cancel")

    async def errors(self, batch_id: str) -> BatchErrorSummary:
        return BatchErrorSummary.model_validate(await self._json("GET", f"/batches/{batch_id}/errors"))

    async def page(self, limit: int) -> dict[str, Any]:
        return await self._json("GET", "/batches", params={"limit": str(limit)})

    async def download(self, file_id: str, target: Path) -> int:
        async with self.session.get(f"{self.config.base_url}/files/{file_id}/content",
                                    headers=self.headers) as answer:
            if answer.status >= 400:
                raise CliError(f"downloading {file_id}: {answer.status}: {await answer.text()}")
            lines = 0
            partial = target.with_name(target.name + ".part")
            with partial.open("wb") as sink:
                async for chunk in answer.content.iter_chunked(UPLOAD_CHUNK):
                    lines += chunk.count(b"\n")
                    await asyncio.to_thread(sink.write, chunk)
            partial.replace(target)
            return lines

    async def events(self, batch_id: str, after: int) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """The batch's events after sequence `after`, as (sequence, event), until its stream ends."""
        headers = {**self.headers, "Last-Event-ID": str(after)}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        async with self.session.get(f"{self.config.base_url}/batches/{batch_id}/events", headers=headers,
                                    timeout=timeout) as answer:
            if answer.status >= 400:
                raise CliError(f"events of {batch_id}: {answer.status}: {await answer.text()}")
            sequence, data = after, ""
            async for raw in answer.content:
                text = raw.decode(errors="replace").rstrip("\r\n")
                if text.startswith("id:"):
                    sequence = int(text[3:].strip() or sequence)
                elif text.startswith("data:"):
                    data += text[5:].strip()
                elif not text and data:
                    try:
                        yield sequence, json.loads(data)
                    except json.JSONDecodeError:
                        pass
                    data = ""


async def follow(api: BatchApi, batch_id: str, out: TextIO) -> dict[str, Any]:
    """Draw the batch's progress from its event stream until it ends (reconnecting where it left off), then what
    went wrong, grouped with fixes, when lines failed; the batch."""
    progress = Progress(out, time.time)
    batch = await api.retrieve(batch_id)
    progress.take_batch(batch)
    after = 0
    while batch["status"] not in TERMINAL:
        progress.draw()
        try:
            async for sequence, event in api.events(batch_id, after):
                after = sequence
                progress.take(event)
                progress.draw()
                if event.get("type") in ENDING_EVENTS:
                    break
        except (TimeoutError, aiohttp.ClientError):
            await asyncio.sleep(1)  # the stream dropped: resume after the last event seen
        batch = await api.retrieve(batch_id)
        progress.take_batch(batch)
        if batch["status"] not in TERMINAL:
            await asyncio.sleep(0.5)
    progress.take_batch(batch, final=True)
    progress.draw(force=True)
    progress.finish()
    if batch["status"] != "completed" or progress.failed:
        out.write(render_errors(await api.errors(batch_id)))
    return batch


async def download_files(api: BatchApi, batch: dict[str, Any], output: Path, errors: Path, out: TextIO) -> None:
    for file_id, target in ((batch.get("output_file_id"), output), (batch.get("error_file_id"), errors)):
        if file_id:
            lines = await api.download(str(file_id), target)
            out.write(f"{target}: {lines} lines\n")


def exit_code(batch: dict[str, Any]) -> int:
    if batch["status"] != "completed":
        return EXIT_NOT_COMPLETED
    return EXIT_LINES_FAILED if int((batch.get("request_counts") or {}).get("failed") or 0) else EXIT_OK


def first_url(path: Path) -> str | None:
    """The `url` of the file's first request line: the batch's endpoint when none is given."""
    with path.open("rb") as source:
        for raw in source:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    return None
                return url if isinstance(url, str) else None
    return None


def errors_path(args: argparse.Namespace) -> Path:
    output: Path = args.output
    return args.errors or output.with_name(output.stem + ".errors" + (output.suffix or ".jsonl"))


def metadata_of(pairs: list[str]) -> dict[str, str] | None:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise CliError(f"--metadata takes key=value (got {pair!r})")
        found[key] = value
    return found or None


def ask_to_cancel() -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        return input("\nCancel the batch? Lines already run are kept. [y/N] ").strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        return False


@dataclass(frozen=True)
class Source:
    path: Path
    size: int
    endpoint: str


def source_of(args: argparse.Namespace) -> "Source | str | None":
    """What `run`/`submit` send: the file (its size, and the endpoint: given, else its first line's url), or for
    `run` a batch id whose wait to resume; None for the other steps."""
    if args.batch_command not in ("run", "submit"):
        return None
    path = Path(args.input)
    if args.batch_command == "run" and not path.exists() and args.input.startswith("batch_"):
        return str(args.input)
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    return Source(path, path.stat().st_size, args.endpoint or first_url(path) or "/v1/chat/completions")


async def command(args: argparse.Namespace, config: Config, out: TextIO, source: "Source | str | None") -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as session:
        api = BatchApi(session, config)
        match args.batch_command:
            case "run" | "submit":
                if isinstance(source, str):
                    batch_id = source  # re-run with the batch id: resume the wait
                else:
                    assert source is not None
                    file_id = await api.upload(source.path, source.size, out)
                    batch = await api.create(file_id, source.endpoint, args.window, metadata_of(args.metadata),
                                             args.allow_partial, args.placement)
                    batch_id = str(batch["id"])
                    out.write(f"batch {batch_id} created ({source.endpoint})\n")
                    if args.batch_command == "submit":
                        print(batch_id)
                        return EXIT_OK
                return await wait_and_download(api, batch_id, args, out)
            case "wait":
                batch = await follow(api, args.batch_id, out)
                return exit_code(batch)
            case "status":
                print(json.dumps(await api.retrieve(args.batch_id), indent=2))
                return EXIT_OK
            case "download":
                batch = await api.retrieve(args.batch_id)
                await download_files(api, batch, args.output, errors_path(args), out)
                return exit_code(batch) if batch["status"] in TERMINAL else EXIT_NOT_COMPLETED
            case "cancel":
                batch = await api.cancel(args.batch_id)
                print(f"{batch['id']}: {batch['status']}")
                return EXIT_OK
            case _:
                for batch in (await api.page(args.limit)).get("data", []):
                    counts = batch.get("request_counts") or {}
                    print(f"{batch['id']}\t{batch['status']}\t{counts.get('completed', 0)}/{counts.get('total', 0)}"
                          f"\t{counts.get('failed', 0)} failed\t{batch['endpoint']}")
                return EXIT_OK


async def wait_and_download(api: BatchApi, batch_id: str, args: argparse.Namespace, out: TextIO) -> int:
    """Follow the batch to its end and download its files; Ctrl-C asks whether to cancel it (then waits for what
    ran) or stops waiting and says how to resume."""
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    try:
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
    except (NotImplementedError, RuntimeError):  # not the main thread: Ctrl-C ends the process as usual
        pass
    following = asyncio.create_task(follow(api, batch_id, out))
    waiting = asyncio.create_task(interrupted.wait())
    try:
        await asyncio.wait({following, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    if not following.done():
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        if not await asyncio.to_thread(ask_to_cancel):
            out.write(f"\nstopped waiting; resume with: sheshnag batch run {batch_id} -o {args.output}\n")
            return EXIT_INTERRUPTED
        await api.cancel(batch_id)
        out.write(f"cancelling {batch_id}; waiting for what ran\n")
        following = asyncio.create_task(follow(api, batch_id, out))
    batch = await following
    await download_files(api, batch, args.output, errors_path(args), out)
    failed = int((batch.get("request_counts") or {}).get("failed") or 0)
    out.write(f"{batch_id}: {batch['status']}, {failed} lines failed\n")
    return exit_code(batch)


DATA_DIR_HELP = ("the data dir of a running `sheshnag up`: its gateway, and its key (SHESHNAG_ADMIN_KEY, else one made "
                 "once and kept there); default without OPENAI_BASE_URL: SHESHNAG_DATA_DIR, else the default data dir")


def add_arguments(batch: argparse.ArgumentParser) -> None:
    batch.add_argument("--base-url", default=None, help="the API's base URL (default: OPENAI_BASE_URL, else the "
                       "local stack's gateway)")
    batch.add_argument("--api-key", default=None, help="an API key (default: OPENAI_API_KEY)")
    batch.add_argument("--data-dir", type=Path, default=None, help=DATA_DIR_HELP)
    steps = batch.add_subparsers(dest="batch_command", required=True)
    for name, text in (("run", "upload, create, follow with a progress bar, download both files"),
                       ("submit", "upload and create; print the batch id")):
        step = steps.add_parser(name, help=text)
        step.add_argument("input", help="the JSONL file (run: or a batch id, to resume its wait)")
        if name == "run":
            step.add_argument("-o", "--output", type=Path, required=True, help="where the output file goes")
            step.add_argument("--errors", type=Path, default=None, help="where the error file goes (default: "
                              "OUTPUT's name with .errors)")
        step.add_argument("--endpoint", default=None, help="default: the first line's url")
        step.add_argument("--window", default="24h", help="completion window (default 24h)")
        step.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
        step.add_argument("--allow-partial", action="store_true", help="run the valid lines if some are refused")
        step.add_argument("--placement", choices=get_args(Placement), default="approved_providers",
                          help="own_organization: run only on your organisation's own providers (default: "
                               "approved providers)")
    for name, text in (("status", "the batch as JSON"), ("wait", "follow the batch until it ends"),
                       ("cancel", "cancel the batch")):
        steps.add_parser(name, help=text).add_argument("batch_id")
    download = steps.add_parser("download", help="download the batch's output and error files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output", type=Path, required=True)
    download.add_argument("--errors", type=Path, default=None)
    listing = steps.add_parser("list", help="your batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    for step in steps.choices.values():
        step.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS, help=DATA_DIR_HELP)


def batch_tool(args: argparse.Namespace, default_data_dir: Path) -> int:
    out = sys.stderr
    try:
        config = config_from(args, default_data_dir)
        return asyncio.run(command(args, config, out, source_of(args)))
    except CliError as error:
        out.write(f"sheshnag batch: {error}\n")
        return EXIT_NOT_COMPLETED
    except KeyboardInterrupt:
        out.write("\ninterrupted\n")
        return EXIT_INTERRUPTED
