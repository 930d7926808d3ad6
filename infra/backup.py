"""`sheshnag backup DIR` / `sheshnag restore DIR`: the deployment's state copied into a folder while it runs, and
made again from that folder on an empty broker, object store and ledger store.

What is kept: every stream as JetStream's own snapshot (messages with their sequences, and consumers' positions)
except the transient ones below, every object of every bucket, the ledger's SQLite store, and `manifest.json`
(counts, sequences and SHA-256 of each piece). Taken in this order, so that each piece is no newer than the next:
ledger store, read model, then `EVENTS`, then the objects (an object is put before the fact naming it).
"""

import argparse
import asyncio
import os
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from minio import Minio
from nats.aio.client import Client
from pydantic import BaseModel

from contracts.subjects import (
    EVENTS_STREAM,
    EXECUTORS_BUCKET,
    KEY_USAGE_BUCKET,
    LEADER_BUCKET,
    LIMITS_BUCKET,
    WORK_STREAM,
)
from infra import stream_snapshots
from infra.backup_objects import BackedUpObject, back_up_objects, check_empty, restore_objects, sha256_of
from infra.embedded import S3Credentials, free_port
from infra.nats_auth import SECRETS_FILE, NatsAuth
from infra.private import PRIVATE_UMASK
from infra.stack_state import find_stack
from infra.supervisor import Stack
from services.ledger.settings import LedgerSettings
from services.runtime.nats.broker import TOOL_ATTEMPTS
from services.runtime.nats.bus import EventBus
from services.runtime.nats.tls import InsecureBrokerUrl
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore

MANIFEST = "manifest.json"
LEDGER_FILE = "ledger.sqlite"
FORMAT_VERSION = 1

TRANSIENT = {
    WORK_STREAM: "commands in flight: the scheduler sends them again from the facts",
    f"KV_{EXECUTORS_BUCKET}": "heartbeats: executors register again when they connect",
    f"KV_{LEADER_BUCKET}": "leases: a restored one would name a process that is gone",
    f"KV_{KEY_USAGE_BUCKET}": "when each key was last used: not a fact",
    f"KV_{LIMITS_BUCKET}": "rate-limit windows and admissions not yet in the read model, each expiring within minutes",
}
"""Streams not backed up, and why. Any other stream is (a new one is kept unless it is named here)."""


class BackedUpStream(BaseModel):
    name: str
    file: str
    bytes: int
    sha256: str
    messages: int
    first_seq: int
    last_seq: int
    config: dict[str, Any]
    state: dict[str, Any]


class Manifest(BaseModel):
    format: int = FORMAT_VERSION
    taken_at: datetime
    streams: list[BackedUpStream]
    """In the order they were taken (and are restored)."""
    skipped_streams: dict[str, str]
    objects: list[BackedUpObject]
    ledger_store: str | None
    """The SQLite store's file in the backup; None when the ledger's store was not copied (PostgreSQL: a new,
    empty store rebuilds itself by folding `EVENTS` from sequence 1)."""


class BackupRefused(RuntimeError):
    """The target is not empty, or the backup is not whole: nothing was changed."""


def _order(names: list[str]) -> list[str]:
    """Derived state first, `EVENTS` last: a read model copied before the log is never ahead of it."""
    return sorted(names, key=lambda name: (name == EVENTS_STREAM, name))


async def _connect(url: str) -> Client:
    # No streams declared: a restore refuses a stream that is already there.
    return (await EventBus.connect(url, "sheshnag-backup", attempts=TOOL_ATTEMPTS, declare=False)).nc


def _empty(folder: Path) -> bool:
    return not folder.exists() or not any(folder.iterdir())


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite database (WAL included), by SQLite's own backup API."""
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as origin, sqlite3.connect(target) as copy:
        origin.backup(copy)
    origin.close()
    copy.close()


async def back_up(target: Path, connection: ConnectionSettings, ledger: LedgerSettings) -> Manifest:
    if not await asyncio.to_thread(_empty, target):
        raise BackupRefused(f"{target} is not empty: back up into a new folder")
    (target / "streams").mkdir(parents=True, exist_ok=True)
    taken_at = datetime.now(UTC)
    ledger_store = None
    if ledger.db_path is not None and not ledger.postgres_dbname:
        if not ledger.db_path.exists():
            raise BackupRefused(f"the ledger's store {ledger.db_path} does not exist")
        await asyncio.to_thread(copy_sqlite, ledger.db_path, target / LEDGER_FILE)
        ledger_store = LEDGER_FILE
    nc = await _connect(connection.nats_url)
    try:
        names = await stream_snapshots.stream_names(nc)
        streams = []
        for name in _order([name for name in names if name not in TRANSIENT]):
            taken = await stream_snapshots.snapshot(nc, name, target / "streams" / f"{name}.snapshot")
            streams.append(BackedUpStream(
                name=name, file=f"streams/{taken.path.name}", bytes=taken.bytes, sha256=taken.sha256,
                messages=taken.state.get("messages", 0), first_seq=taken.state.get("first_seq", 0),
                last_seq=taken.state.get("last_seq", 0), config=taken.config, state=taken.state))
    finally:
        await nc.close()
    if EVENTS_STREAM not in {stream.name for stream in streams}:
        raise BackupRefused(f"the broker has no {EVENTS_STREAM} stream: is SHESHNAG_NATS_URL the deployment's?")
    objects = await asyncio.to_thread(back_up_objects, _minio(connection), target / "objects")
    manifest = Manifest(taken_at=taken_at, streams=streams, objects=objects, ledger_store=ledger_store,
                        skipped_streams={name: why for name, why in TRANSIENT.items() if name in names})
    (target / MANIFEST).write_text(manifest.model_dump_json(indent=2))
    return manifest


def _minio(connection: ConnectionSettings) -> Minio:
    store = ObjectStore.from_settings(connection)
    store.close()  # only its configured client is used, from this thread
    return store.client


def read_manifest(source: Path) -> Manifest:
    path = source / MANIFEST
    if not path.exists():
        raise BackupRefused(f"{source} holds no {MANIFEST}: not a backup")
    manifest = Manifest.model_validate_json(path.read_text())
    for stream in manifest.streams:
        if sha256_of(source / stream.file) != stream.sha256:
            raise BackupRefused(f"{stream.file} does not match the SHA-256 in the manifest")
    return manifest


async def restore(source: Path, connection: ConnectionSettings, ledger: LedgerSettings) -> Manifest:
    """Everything in the backup made again; refused, with nothing changed, unless every target is empty."""
    manifest = read_manifest(source)
    client = _minio(connection)
    nc = await _connect(connection.nats_url)
    try:
        present = [s.name for s in manifest.streams if await stream_snapshots.exists(nc, s.name)]
        if present:
            raise BackupRefused(f"the broker has {', '.join(present)} already: restore onto an empty broker, "
                                "before any service starts")
        if manifest.ledger_store and ledger.db_path is not None and ledger.db_path.exists():
            raise BackupRefused(f"the ledger's store {ledger.db_path} exists already")
        await asyncio.to_thread(check_empty, client, {item.bucket for item in manifest.objects})
        for stream in manifest.streams:
            state = await stream_snapshots.restore(nc, stream.name, source / stream.file, stream.config,
                                                   stream.state, connection.nats_replicas)
            if (state.get("messages"), state.get("last_seq")) != (stream.messages, stream.last_seq):
                raise BackupRefused(f"{stream.name} restored with {state.get('messages')} messages to sequence "
                                    f"{state.get('last_seq')}, not {stream.messages} to {stream.last_seq}")
    finally:
        await nc.close()
    await asyncio.to_thread(restore_objects, client, source / "objects", manifest.objects)
    if manifest.ledger_store and ledger.db_path is not None and not ledger.postgres_dbname:
        ledger.db_path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(copy_sqlite, source / manifest.ledger_store, ledger.db_path)
    return manifest


def embedded_settings(data_dir: Path, nats_port: int, s3_port: int) -> tuple[ConnectionSettings, LedgerSettings]:
    """The connection `sheshnag up` gives its services, from the data dir's secrets and the ports it printed."""
    for name in (SECRETS_FILE, "s3-credentials.json"):
        if not (data_dir / name).exists():
            raise BackupRefused(f"{data_dir} holds no {name}: not a `sheshnag up` data dir")
    credentials = S3Credentials.load_or_create(data_dir / "s3-credentials.json")
    connection = ConnectionSettings(nats_url=NatsAuth.load_or_create(data_dir).core_url(nats_port),
                                    s3_endpoint=f"127.0.0.1:{s3_port}", s3_access_key=credentials.access_key,
                                    s3_secret_key=credentials.secret_key)
    return connection, LedgerSettings(connection=connection, db_path=data_dir / LEDGER_FILE)


async def restore_data_dir(source: Path, data_dir: Path) -> Manifest:
    """Restore into a new `sheshnag up` data dir: its broker and object store run for the restore alone."""
    if not await asyncio.to_thread(_empty, data_dir):
        raise BackupRefused(f"{data_dir} is not empty: restore into a new data dir")
    read_manifest(source)
    s3_port = free_port()
    nats_port = free_port(frozenset({s3_port}))
    stack = Stack(data_dir, free_port(frozenset({s3_port, nats_port})), nats_port, s3_port)
    try:
        await asyncio.to_thread(stack.start_infra)
        connection, ledger = embedded_settings(data_dir, stack.nats_port, stack.s3_port)
        return await restore(source, connection, ledger)
    finally:
        await asyncio.to_thread(stack.stop)


def running_settings(data_dir: Path) -> tuple[ConnectionSettings, LedgerSettings]:
    """The connection of the `sheshnag up` running from `data_dir`, from the state file it keeps there (ports, and
    the broker's CA for a stack behind TLS), as the operator tools find theirs; exits saying so when none runs."""
    find_stack(data_dir, data_dir)
    return ConnectionSettings(), LedgerSettings()


def add_backup_arguments(backup: argparse.ArgumentParser) -> None:
    backup.add_argument("dir", type=Path, help="a new or empty folder")
    backup.add_argument("--data-dir", type=Path, default=None, help="the running `sheshnag up` stack's data dir (its "
                        "ports and credentials are read from it); else SHESHNAG_NATS_URL, SHESHNAG_S3_* and "
                        "SHESHNAG_LEDGER_* say where the deployment is")
    backup.add_argument("--nats-port", type=int, default=None, help="with --data-dir: the broker's port (default: "
                        "the running stack's)")
    backup.add_argument("--s3-port", type=int, default=None, help="with --data-dir: the object store's port "
                        "(default: the running stack's)")


def add_restore_arguments(restore_: argparse.ArgumentParser) -> None:
    restore_.add_argument("dir", type=Path, help="a folder `sheshnag backup` wrote")
    restore_.add_argument("--data-dir", type=Path, default=None, help="a new data dir to restore into (then "
                          "`sheshnag up --data-dir` it); else into the empty broker, object store and ledger store "
                          "SHESHNAG_* name, with no service running")


def backup_tool(args: argparse.Namespace) -> int:
    os.umask(PRIVATE_UMASK)  # a backup holds every fact and file: its owner's alone
    try:
        if args.data_dir is not None and args.nats_port and args.s3_port:
            connection, ledger = embedded_settings(args.data_dir.expanduser().resolve(), args.nats_port,
                                                   args.s3_port)
        elif args.data_dir is not None:
            connection, ledger = running_settings(args.data_dir.expanduser().resolve())
        else:
            connection, ledger = ConnectionSettings(), LedgerSettings()
        manifest = asyncio.run(back_up(args.dir, connection, ledger))
    except (BackupRefused, stream_snapshots.SnapshotFailed, InsecureBrokerUrl, OSError) as error:
        print(f"sheshnag backup: {error}", file=sys.stderr)
        return 1
    print(summary("backed up", manifest, args.dir))
    return 0


def restore_tool(args: argparse.Namespace) -> int:
    os.umask(PRIVATE_UMASK)
    try:
        if args.data_dir is not None:
            manifest = asyncio.run(restore_data_dir(args.dir, args.data_dir.expanduser().resolve()))
        else:
            manifest = asyncio.run(restore(args.dir, ConnectionSettings(), LedgerSettings()))
    except (BackupRefused, stream_snapshots.SnapshotFailed, InsecureBrokerUrl, OSError) as error:
        print(f"sheshnag restore: {error}", file=sys.stderr)
        return 1
    print(summary("restored", manifest, args.dir))
    return 0


def summary(done: str, manifest: Manifest, where: Path) -> str:
    streams = ", ".join(f"{s.name} ({s.messages} messages to sequence {s.last_seq})" for s in manifest.streams)
    ledger = "the ledger's store" if manifest.ledger_store else "no ledger store (it refolds EVENTS)"
    return (f"{done} {where}: {streams}; {len(manifest.objects)} objects "
            f"({sum(o.bytes for o in manifest.objects):,} bytes); {ledger}; taken {manifest.taken_at.isoformat()}")
