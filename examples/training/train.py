"""The reference training script: a small model trained with DistributedDataParallel over gloo on
CPU, under torchrun, that can be stopped and resumed without changing its result.

Run it under torchrun (``python3 -m torch.distributed.run ... train.py --checkpoint-dir DIR``);
each process is one rank. What it does:

- a fixed seed gives the model's initial weights and, for every (step, rank), that step's batch:
  the data is a function of the step, not of how many steps this process has run, so a run resumed
  at step K sees exactly the batches an uninterrupted run sees from K on;
- every ``--checkpoint-every`` steps rank 0 writes a checkpoint (model, optimizer with its momentum,
  step) to ``--checkpoint-dir``, a volume that outlives the pod;
- on SIGTERM (what Kubernetes sends before SIGKILL: a preemption, an eviction, a stop by
  dispatch) the rank finishes the step it is in, writes a checkpoint and exits 143; if the step
  cannot finish (a peer is already gone), it writes the last finished one;
- at start it resumes from the newest checkpoint in the directory (rank 0 logs
  ``resumed at step K``) and at the end rank 0 writes the final model and its digest.

Checkpoints are tagged with ``DISPATCH_SUBMISSION``, the submission number dispatch gives each pod
(monotonic: a fencing token). A submission raises the directory's fence to its number when it
starts; a writer whose number is below the fence (a late process of an older submission, still
shutting down while the next one runs) refuses to write and exits 3, so it can never replace a
newer submission's checkpoint. Files are written to a temporary name and renamed into place: a
checkpoint is either whole or absent. Each ``step-K.pt`` is committed by its ``step-K.json``
(step, submission, reason, digest), written last; the final model is ``final.pt`` with
``final.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Stop:
    """SIGTERM asks for a stop; the training loop honours it between steps. Installed before torch
    is imported: a SIGTERM during that import (seconds on a busy node) must not kill the process
    outright."""

    requested = False

    @classmethod
    def on_term(cls, signum: int, frame: object) -> None:
        cls.requested = True


signal.signal(signal.SIGTERM, Stop.on_term)

# After the handler, on purpose.
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

EXIT_STOPPED = 128 + signal.SIGTERM
"""The exit code after a checkpoint on SIGTERM: stopped by a signal, not finished."""
EXIT_FENCED = 3
"""The exit code of a submission that a newer one has fenced out of the directory."""
FENCE = "fence"
NONE, FOUND, FENCED = 0, 1, 2


def options(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-dir", type=Path, default=Path(env("CHECKPOINT_DIR", "/checkpoints")))
    p.add_argument("--checkpoint-every", type=int, default=int(env("CHECKPOINT_EVERY", "50")))
    p.add_argument("--steps", type=int, default=int(env("TRAIN_STEPS", "200")))
    p.add_argument("--seed", type=int, default=int(env("TRAIN_SEED", "0")))
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--step-seconds",
        type=float,
        default=float(env("TRAIN_STEP_SECONDS", "0")),
        help="least wall time of a step (a stand-in for a bigger model's compute)",
    )
    return p.parse_args(argv)


def log(*words: object) -> None:
    print(f"[rank {dist.get_rank() if dist.is_initialized() else '?'}]", *words, flush=True)


def model_of(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(args.seed)
    return nn.Sequential(nn.Linear(args.features, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))


def batch(args: argparse.Namespace, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: a function of (seed, step, rank) alone."""
    truth = torch.Generator().manual_seed(args.seed)
    w = torch.randn(args.features, 1, generator=truth)
    g = torch.Generator().manual_seed((args.seed * 1_000_003 + step) * world + rank)
    x = torch.randn(args.batch, args.features, generator=g)
    y = torch.sin(x @ w / args.features**0.5) + 0.05 * torch.randn(args.batch, 1, generator=g)
    return x, y


def digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of the parameters' names, shapes and bytes, in order: equal models, equal digests."""
    h = hashlib.sha256()
    for name, tensor in state.items():
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(bytes(t.view(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


class Fenced(Exception):
    """A newer submission owns the checkpoint directory."""


class Checkpoints:
    """The checkpoint directory: newest checkpoint, atomic writes, the submission fence."""

    def __init__(self, directory: Path, submission: int) -> None:
        self.dir = directory
        self.submission = submission
        self.dir.mkdir(parents=True, exist_ok=True)

    def fence(self) -> int:
        try:
            return int((self.dir / FENCE).read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def raise_fence(self) -> None:
        """Claim the directory for this submission (never lowers it)."""
        current = self.fence()
        if current > self.submission:
            raise Fenced(f"submission {current} owns {self.dir}; this is submission {self.submission}")
        if current < self.submission:
            self._atomic(FENCE, str(self.submission).encode())

    def newest(self) -> dict[str, Any] | None:
        """The committed checkpoint with the highest step (the newer submission on a tie)."""
        found: list[dict[str, Any]] = []
        for meta in self.dir.glob("step-*.json"):
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(meta.read_text())
                if (self.dir / record["file"]).exists():
                    found.append(record)
        return max(found, key=lambda r: (r["step"], r["submission"]), default=None)

    def written(self, name: str) -> dict[str, Any] | None:
        """The commit record of ``name`` if this submission wrote it already."""
        with contextlib.suppress(OSError, ValueError):
            record: dict[str, Any] = json.loads((self.dir / f"{name}.json").read_text())
            if record.get("submission") == self.submission:
                return record
        return None

    def write(self, name: str, state: dict[str, Any], record: dict[str, Any]) -> None:
        """``name``.pt, then ``name``.json (the commit), each through a temporary file and a rename;
        refused below the fence."""
        fence = self.fence()
        if fence > self.submission:
            raise Fenced(f"not writing {name}: submission {fence} owns {self.dir}, this is {self.submission}")
        with self._temporary(f"{name}.pt") as tmp:
            torch.save(state, tmp)
        meta = {**record, "file": f"{name}.pt", "submission": self.submission}
        self._atomic(f"{name}.json", json.dumps(meta, sort_keys=True).encode())

    def _atomic(self, name: str, data: bytes) -> None:
        with self._temporary(name) as tmp, open(tmp, "wb") as f:
            f.write(data)

    @contextlib.contextmanager
    def _temporary(self, name: str) -> Iterator[Path]:
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        try:
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / name)
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            tmp.unlink(missing_ok=True)


def train(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    submission = int(os.environ.get("DISPATCH_SUBMISSION", "0"))
    ckpt = Checkpoints(args.checkpoint_dir, submission)

    module = model_of(args)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    # Rank 0 claims the directory and picks the checkpoint; every rank loads that same one. The
    # choice travels as a tensor, [what, step]: what is NONE, FOUND or FENCED.
    pick = torch.zeros(2, dtype=torch.int64)
    if rank == 0:
        try:
            ckpt.raise_fence()
            newest = ckpt.newest()
            if newest is not None:
                pick = torch.tensor([FOUND, newest["step"]], dtype=torch.int64)
        except Fenced as e:
            log(str(e))
            pick = torch.tensor([FENCED, 0], dtype=torch.int64)
    dist.broadcast(pick, src=0)
    what, step = int(pick[0]), int(pick[1])
    if what == FENCED:
        return EXIT_FENCED
    if what == FOUND:
        found = json.loads((args.checkpoint_dir / f"step-{step:08d}.json").read_text())
        if found.get("world_size") != world:
            log(f"{found['file']} was written by {found.get('world_size')} ranks, not {world}: not resuming")
            return 2
        state = torch.load(args.checkpoint_dir / found["file"], weights_only=True)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if rank == 0:
            origin = f"submission {found['submission']}, {found['reason']}"
            log(f"resumed at step {step} from {found['file']} ({origin})")
    elif rank == 0:
        log(f"starting at step 0 (no checkpoint in {args.checkpoint_dir})")
    model = DistributedDataParallel(module, broadcast_buffers=False)
    loss_fn = nn.MSELoss()
    done = step

    def save(reason: str) -> None:
        name = f"step-{done:08d}"
        # Every rank holds the same state after a step: when two stop at the same step (the first
        # preempted, the other stopped a moment later), the first one's checkpoint stands.
        first = ckpt.written(name)
        if first is not None:
            log(f"checkpoint at step {done} already written by rank {first['rank']} ({first['host']})")
            return
        state = {"step": done, "model": module.state_dict(), "optimizer": optimizer.state_dict()}
        record = {"step": done, "reason": reason, "rank": rank, "host": socket.gethostname()}
        record |= {"world_size": world, "seed": args.seed, "digest": digest(module.state_dict())}
        ckpt.write(name, state, record)
        log(f"checkpoint at step {done} ({reason}, submission {submission})")

    try:
        while done < args.steps:
            if Stop.requested:
                log(f"SIGTERM: stopping at step {done}")
                break
            started = time.monotonic()
            x, y = batch(args, done + 1, rank, world)
            optimizer.zero_grad(set_to_none=True)
            try:
                loss = loss_fn(model(x), y)
                loss.backward()  # the gradients' all-reduce: a gone peer fails it here
            except (RuntimeError, dist.DistBackendError) as e:
                if not Stop.requested:
                    raise
                log(f"step {done + 1} cut short by the stop ({type(e).__name__})")
                break
            optimizer.step()
            done += 1
            if rank == 0 and (done % 10 == 0 or done == args.steps):
                log(f"step {done} loss {loss.item():.6f}")
            if rank == 0 and args.checkpoint_every > 0 and done % args.checkpoint_every == 0:
                save("periodic")
            rest = args.step_seconds - (time.monotonic() - started)
            if rest > 0:
                time.sleep(rest)
        if done < args.steps:
            if done > step:
                save("sigterm")
            return EXIT_STOPPED
    except Fenced as e:
        log(str(e))
        return EXIT_FENCED
    if rank == 0:
        final = module.state_dict()
        ckpt.write(
            "final",
            {"step": done, "model": final},
            {"step": done, "reason": "final", "digest": digest(final)},
        )
        log(f"finished at step {done}: model digest {digest(final)}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = train(options())
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown on a stop: a process group whose peer is gone can hang
    # there, and the checkpoint is already on disk.
    os._exit(code) if code else sys.exit(0)
