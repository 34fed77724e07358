"""Model store: parallel HTTP transfers with the sha256 computed while the bytes arrive.

Standard library only (runs on the target). Several files move at once, and a large file moves in ranges on
several streams. Every chunk is written at its offset in `<file>.part` as it arrives and handed, in memory,
to one hashing thread per file that consumes the ranges in file order, so the sha256 (and git blob id) is
ready when the last byte lands: no second read. Chunks that arrive ahead of the hashing position are held
until it reaches them, within `buffer_bytes` (the chunks of the range at the hashing position are never
held back, so the transfer cannot stall); this bounds memory whatever the file size.

Which byte ranges of a `.part` file are on disk is recorded in `.model_store/parts/<file>.json` as ranges
complete, and when a transfer stops (the partial range up to its last written byte). The next run fetches
only the rest; the ranges kept from an earlier run are hashed from disk, in order, by the same thread.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field

from ansible_collections.blackwell.serving.plugins.module_utils.model.store import (
    HASH_CHUNK,
    PART_SUFFIX,
    STATE_DIR,
    Digest,
    ModelStoreError,
    RemoteFile,
    http_error_text,
    write_json_atomic,
)

CHUNK = 4 * 1024 * 1024
PARTS_DIR = STATE_DIR + "/parts"


def return_freed_chunks_to_the_os() -> None:
    """Let glibc serve every chunk-sized block with mmap and unmap it when freed.

    Its default threshold rises to the size of the blocks freed, after which 8 MiB chunks come from per-thread
    arenas that keep freed memory: with 8 streams the peak RSS reached 745 MiB for a 256 MiB budget (366 MiB
    with this threshold). A fixed threshold keeps the peak near the budget. No-op where the C library is not glibc.
    """
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1024 * 1024)  # M_MMAP_THRESHOLD


def default_streams() -> int:
    """One stream per CPU, at most 4. On 2 cores (bench/results/bench_model_fetch.txt) 1 stream moved 170 MiB/s,
    2 streams 313, 4 streams 303 and 8 streams 331 with twice the memory: each file is hashed on one core, so
    more streams than cores add little."""
    return max(1, min(os.cpu_count() or 1, 4))


class RangeInterruptedError(Exception):
    """A range stopped early for a reason worth retrying (network, server error)."""


def parts_record(dest: str, rel: str) -> str:
    return os.path.join(dest, PARTS_DIR, rel + ".json")


def kept_ranges(dest: str, rel: str, size: int) -> list[tuple[int, int]]:
    """Byte ranges of `<rel>.part` already on disk: from the record, else the part's length (one stream)."""
    part = os.path.join(dest, rel + PART_SUFFIX)
    if not os.path.isfile(part):
        return []
    on_disk = os.path.getsize(part)
    try:
        with open(parts_record(dest, rel), encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return [(0, min(on_disk, size))] if on_disk else []
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("size") != size:
        return []
    ranges = []
    for pair in doc.get("done", []):
        if isinstance(pair, list) and len(pair) == 2 and 0 <= pair[0] < pair[1] <= min(size, on_disk):
            ranges.append((int(pair[0]), int(pair[1])))
    return merge_ranges(ranges)


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def kept_bytes(dest: str, rel: str, size: int) -> int:
    return sum(end - start for start, end in kept_ranges(dest, rel, size))


@dataclass
class Piece:
    """One byte range of a file: kept from an earlier run (hashed from disk) or to fetch."""

    start: int
    end: int
    kept: bool = False
    next: int = 0  # next offset to fetch
    done: bool = False
    chunks: collections.deque = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self.next = self.end if self.kept else self.start
        self.done = self.kept


def plan_pieces(size: int, kept: list[tuple[int, int]], piece_bytes: int) -> list[Piece]:
    pieces: list[Piece] = []
    position = 0
    for start, end in [*kept, (size, size)]:
        while position < start:
            step = min(piece_bytes, start - position)
            pieces.append(Piece(position, position + step))
            position += step
        if end > start:
            pieces.append(Piece(start, end, kept=True))
        position = max(position, end)
    return pieces


class FileJob:
    """One file in transfer: its pieces, its `.part`, its digest and the hashing thread's result."""

    def __init__(self, dest: str, item: RemoteFile, piece_bytes: int, order: int, cv: threading.Condition) -> None:
        self.cv = cv
        self.hash_lock = threading.RLock()
        self.dest = dest
        self.item = item
        self.order = order
        self.full = os.path.join(dest, item.path)
        self.part = self.full + PART_SUFFIX
        os.makedirs(os.path.dirname(self.full), exist_ok=True)
        self.pieces = plan_pieces(item.size, kept_ranges(dest, item.path, item.size), piece_bytes)
        self.pending = collections.deque(piece for piece in self.pieces if not piece.kept)
        self.kept = sum(piece.end - piece.start for piece in self.pieces if piece.kept)
        self.fd = os.open(self.part, os.O_WRONLY | os.O_CREAT, 0o644)
        self.digest = Digest(item.size, want_git_oid=bool(item.git_oid))
        self.inflight = 0
        self.hash_index = 0
        self.error: BaseException | None = None
        self.sha256: str | None = None
        self.finished = False

    def done_ranges(self) -> list[list[int]]:
        ranges = [(piece.start, piece.next) for piece in self.pieces if piece.next > piece.start]
        return [list(pair) for pair in merge_ranges(ranges)]

    def save_record(self) -> None:
        write_json_atomic(
            parts_record(self.dest, self.item.path), {"size": self.item.size, "done": self.done_ranges()}
        )

    def drop_record(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts_record(self.dest, self.item.path))


class ParallelFetch:
    """Fetch files over HTTP with `streams` connections, hashing each file once while it arrives.

    `open_range(url, start, end)` returns a response for bytes [start, end) (urllib's, with status and
    headers); `url_of(item)` gives the URL of a file. Files are started in order; a worker takes a range of
    the open file with the fewest streams on it, so several files move side by side (one hashing thread
    each) and the last large file is split over every stream. After `deadline` (monotonic) no new file is
    started; files already started are finished.
    """

    def __init__(
        self,
        dest: str,
        items: list[RemoteFile],
        url_of: Callable[[RemoteFile], str],
        open_range: Callable[[str, int, int, int], object],
        *,
        streams: int = 4,
        piece_bytes: int = 64 * 1024 * 1024,
        buffer_bytes: int = 128 * 1024 * 1024,
        retries: int = 3,
        retry_delay: float = 2.0,
        verify_checksums: bool = True,
        deadline: float | None = None,
        on_file_done: Callable[[RemoteFile, str], None] | None = None,
    ) -> None:
        self.dest = dest
        self.waiting = collections.deque(enumerate(items))
        self.url_of = url_of
        self.open_range = open_range
        self.streams = streams if streams > 0 else default_streams()
        self.piece_bytes = max(64 * 1024, piece_bytes)
        self.buffer_bytes = max(0, buffer_bytes)
        self.retries = retries
        self.retry_delay = retry_delay
        self.verify_checksums = verify_checksums
        self.deadline = deadline
        self.on_file_done = on_file_done
        # one lock; `cv` wakes workers held back by the buffer budget, each file's `cv` its hashing thread
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        self.held_back = 0
        self.open_jobs: list[FileJob] = []
        self.all_jobs: list[FileJob] = []
        self.hashers: list[threading.Thread] = []
        self.buffered = 0
        self.received = 0  # bytes fetched over the network by this call
        self.kept = 0  # bytes kept from earlier runs in the files this call started

    # -- scheduling

    def take_work(self) -> tuple[FileJob, Piece] | None:
        with self.cv:
            while True:
                candidates = [job for job in self.open_jobs if job.pending and job.error is None]
                fresh = min((job.inflight for job in candidates), default=None)
                if (fresh is None or fresh > 0) and self.may_open_file():
                    job = self.open_next_file()
                    if job is None:
                        continue  # nothing to fetch in that file (all kept): look again
                    candidates = [job]
                if not candidates:
                    return None
                job = min(candidates, key=lambda job: (job.inflight, job.order))
                job.inflight += 1
                return job, job.pending.popleft()

    def may_open_file(self) -> bool:
        if not self.waiting:
            return False
        if self.deadline is not None and time.monotonic() >= self.deadline and self.all_jobs:
            return False
        return len([job for job in self.open_jobs if job.pending]) < self.streams

    def open_next_file(self) -> FileJob | None:
        order, item = self.waiting.popleft()
        job = FileJob(self.dest, item, self.piece_bytes, order, threading.Condition(self.lock))
        self.kept += job.kept
        self.all_jobs.append(job)
        self.open_jobs.append(job)
        thread = threading.Thread(target=self.hash_file, args=(job,), daemon=True)
        self.hashers.append(thread)
        thread.start()
        return job if job.pending else None

    # -- workers

    def work(self) -> None:
        while True:
            taken = self.take_work()
            if taken is None:
                return
            job, piece = taken
            try:
                self.fetch_piece(job, piece)
            except BaseException as exc:
                self.fail(job, exc)
            finally:
                with self.cv:
                    job.inflight -= 1

    def fail(self, job: FileJob, exc: BaseException) -> None:
        with self.cv:
            if job.error is None:
                job.error = exc
            job.cv.notify_all()
            self.cv.notify_all()

    def fetch_piece(self, job: FileJob, piece: Piece) -> None:
        attempt = 0
        while piece.next < piece.end and job.error is None:
            try:
                self.stream_piece(job, piece)
            except RangeInterruptedError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise ModelStoreError(
                        f"{job.item.path}: {exc}; gave up after {self.retries} retries: re-run to resume "
                        f"(the bytes received are kept in {job.part})"
                    ) from exc
                time.sleep(min(self.retry_delay * 2 ** (attempt - 1), 60))
        if job.error is not None:
            return
        with self.cv:
            piece.done = True
            job.save_record()
            job.cv.notify()

    def stream_piece(self, job: FileJob, piece: Piece) -> None:
        url = self.url_of(job.item)
        try:
            response = self.open_range(url, piece.next, piece.end, job.item.size)
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                raise RangeInterruptedError(http_error_text(exc, url)) from exc
            raise ModelStoreError(f"{job.item.path}: {http_error_text(exc, url)}") from exc
        except OSError as exc:
            raise RangeInterruptedError(f"cannot reach {url}: {exc}") from exc
        with response:
            skip = self.check_answer(response, piece, job.item, url)
            try:
                self.skip_bytes(response, skip)
                self.copy_piece(job, piece, response)
            except OSError as exc:
                if exc.errno is not None and getattr(exc, "filename", None) == job.part:
                    raise ModelStoreError(f"cannot write {job.part}: {exc}") from exc
                raise RangeInterruptedError(f"transfer of {job.item.path} stopped at byte {piece.next}: {exc}") from exc
            except Exception as exc:  # http.client.IncompleteRead and friends
                if isinstance(exc, ModelStoreError):
                    raise
                raise RangeInterruptedError(f"transfer of {job.item.path} stopped at byte {piece.next}: {exc}") from exc
        if piece.next < piece.end:
            raise RangeInterruptedError(
                f"transfer of {os.path.basename(job.part)} stopped at {piece.next} bytes (range "
                f"{piece.start}-{piece.end - 1} of {job.item.size})"
            )

    @staticmethod
    def check_answer(response, piece: Piece, item: RemoteFile, url: str) -> int:
        """Bytes to discard before piece.next: 0 for a 206 at the right offset, piece.next for a plain 200."""
        status = getattr(response, "status", 200)
        if status == 206:
            header = response.headers.get("Content-Range")
            match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", (header or "").strip())
            if not match or int(match.group(1)) != piece.next:
                raise ModelStoreError(f"{url} answered Range bytes={piece.next}- with Content-Range {header!r}")
            if match.group(3) != "*" and int(match.group(3)) != item.size:
                raise ModelStoreError(
                    f"{url} is {match.group(3)} bytes but the listing says {item.size}: the source changed "
                    "while fetching; re-run to list it again"
                )
            return 0
        return piece.next  # the server ignored Range and sends the whole file: read up to where we are

    @staticmethod
    def skip_bytes(response, count: int) -> None:
        while count > 0:
            data = response.read(min(CHUNK, count))
            if not data:
                raise RangeInterruptedError("the answer ended before the requested range")
            count -= len(data)

    def copy_piece(self, job: FileJob, piece: Piece, response) -> None:
        while piece.next < piece.end:
            if job.error is not None:
                return
            chunk = response.read(min(CHUNK, piece.end - piece.next))
            if not chunk:
                return
            os.pwrite(job.fd, chunk, piece.next)
            with self.cv:
                # over the budget a chunk waits, unless it is at the hashing position with nothing queued
                # before it (then it is hashed at once, so the transfer cannot stall)
                while (
                    self.buffered + len(chunk) > self.buffer_bytes
                    and job.error is None
                    and (job.pieces[job.hash_index] is not piece or piece.chunks)
                ):
                    self.held_back += 1
                    self.cv.wait(1.0)
                    self.held_back -= 1
                piece.chunks.append(chunk)
                piece.next += len(chunk)
                self.buffered += len(chunk)
                self.received += len(chunk)
                at_hash_position = job.pieces[job.hash_index] is piece
            # at the hashing position the worker hashes its own chunks (no hand-over between threads);
            # otherwise, or while another thread hashes this file, the file's hashing thread takes them
            if not (at_hash_position and self.hash_queued(job, piece, wait=False)):
                with self.cv:
                    job.cv.notify()

    # -- hashing, one thread per file

    def hash_file(self, job: FileJob) -> None:
        try:
            for index, piece in enumerate(job.pieces):
                with self.cv:
                    job.hash_index = index
                    if self.held_back:
                        self.cv.notify_all()
                if piece.kept:
                    self.hash_kept(job, piece)
                elif not self.hash_arriving(job, piece):
                    return
            self.finish_file(job)
        except BaseException as exc:
            self.fail(job, exc)
        finally:
            with self.cv:
                job.finished = True

    def hash_kept(self, job: FileJob, piece: Piece) -> None:
        with open(job.part, "rb") as handle:
            handle.seek(piece.start)
            left = piece.end - piece.start
            while left > 0:
                data = handle.read(min(HASH_CHUNK, left))
                if not data:
                    raise ModelStoreError(f"{job.part} is shorter than its record of kept ranges")
                job.digest.update(data)
                left -= len(data)

    def hash_queued(self, job: FileJob, piece: Piece, wait: bool) -> bool:
        """Hash the chunks queued for piece, in order; False when another thread is hashing this file.

        Whoever hashes holds the file's hash lock from taking chunks until they are hashed, so chunks are
        hashed in the order they were queued even when the worker and the hashing thread both try.
        """
        if not job.hash_lock.acquire(blocking=wait):
            return False
        try:
            while True:
                with self.cv:
                    chunks = list(piece.chunks)
                    piece.chunks.clear()
                    self.buffered -= sum(len(chunk) for chunk in chunks)
                    if chunks and self.held_back:
                        self.cv.notify_all()
                if not chunks:
                    return True
                for chunk in chunks:
                    job.digest.update(chunk)
        finally:
            job.hash_lock.release()

    def hash_arriving(self, job: FileJob, piece: Piece) -> bool:
        while True:
            with self.cv:
                while not piece.chunks and not piece.done and job.error is None:
                    job.cv.wait(1.0)
                finished = piece.done
            with job.hash_lock:  # no worker is between taking and hashing chunks of this piece now
                self.hash_queued(job, piece, wait=True)
                if job.error is not None:
                    return False
                if finished and not piece.chunks:
                    return True

    def finish_file(self, job: FileJob) -> None:
        os.close(job.fd)
        job.fd = -1
        size = os.path.getsize(job.part)
        if size != job.item.size:
            raise ModelStoreError(f"{job.part} is {size} bytes, expected {job.item.size}: re-run to resume")
        mismatch = job.digest.mismatch(job.item) if self.verify_checksums else None
        job.drop_record()
        if mismatch:
            bad = job.part + ".rejected"
            os.replace(job.part, bad)
            raise ModelStoreError(
                f"{job.item.path} downloaded with {mismatch}. The download was set aside as {bad} (remove it); "
                "re-run to fetch it again, and check the source if it happens again"
            )
        job.sha256 = job.digest.sha256.hexdigest()
        os.replace(job.part, job.full)
        if self.on_file_done is not None:
            self.on_file_done(job.item, job.sha256)

    # -- run

    def run(self, report: Callable[[], None] | None = None) -> list[str]:
        """Fetch; return the paths finished. The first failure is raised after the others have stopped."""
        return_freed_chunks_to_the_os()
        workers = [threading.Thread(target=self.work, daemon=True) for _ in range(self.streams)]
        for worker in workers:
            worker.start()
        for group in (workers, self.hashers):  # no file is opened once the workers are gone
            for thread in list(group):
                while thread.is_alive():
                    thread.join(1.0)
                    if report is not None:
                        report()
        failures = []
        for job in self.all_jobs:
            if job.fd >= 0:
                os.close(job.fd)
                job.fd = -1
            if job.error is not None:
                failures.append(job)
                if os.path.exists(job.part):
                    job.save_record()  # keep what arrived, for the next run
        if failures:
            error = failures[0].error
            if isinstance(error, ModelStoreError):
                raise error
            raise ModelStoreError(f"{failures[0].item.path}: {error}") from error
        return [job.item.path for job in self.all_jobs if job.sha256 is not None]

    def pending_files(self) -> int:
        return len(self.waiting)
