#!/usr/bin/env python3
"""Tiny deterministic CPU training loop for allot's torchrun gang tests.

Run as `torchrun train.py --ckpt-dir DIR --steps N [--rank-log FILE]`; torchrun takes its
rendezvous flags from the PET_* variables allot sets. On SIGUSR1 (allot's preemption,
delivered directly and again forwarded by the torchrun agent) all ranks stop at the same
step, save DIR/rank-R.pt, rank 0 writes DIR/complete.json, each host's local rank 0
touches $ALLOT_CHECKPOINT_DIR/checkpoint.done, and every rank exits 0. A later run resumes
from that checkpoint at exactly its step. On SIGUSR2 (a `--signal USR2@…` warning before
the time limit) all ranks save a checkpoint at one step, log `warned`, and train on.
"""
import os
import signal
import sys

# Install the handler before the slow `import torch`: SIGUSR1's default action kills
# the process, and allot may preempt at any moment. The handler only sets a flag (it
# may arrive twice); the work happens at the next step boundary, on all ranks alike.
STOP = False
# SIGUSR2 is the time-limit warning (`--signal USR2@…`): checkpoint at the next step
# and train on; the limit's own ladder (SIGUSR1) ends the run.
WARN = False


def _on_usr1(signum, frame):
    global STOP
    STOP = True


def _on_usr2(signum, frame):
    global WARN
    WARN = True


signal.signal(signal.SIGUSR1, _on_usr1)
signal.signal(signal.SIGUSR2, _on_usr2)
# SIGTERM/SIGINT mean "die now" (allot's ladder has given up on the checkpoint, or the
# agent is tearing down): keep the default action so no collective can hold us.
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.SIG_DFL)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

PACE_S = 0.2  # one optimizer step per PACE_S, so a test can preempt mid-run


def main():
    global WARN
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True, help="persistent, shared by all ranks and runs")
    ap.add_argument("--steps", type=int, required=True, help="total steps; exit 0 when done")
    ap.add_argument("--rank-log", dest="log", help="also append this rank's lines to FILE (not --log: torchrun would take that for its own --log-dir)")
    args = ap.parse_args()
    run = os.environ.get("ALLOT_RUN", "0")

    def say(msg):
        # One write per line: torchrun runs workers unbuffered, where print() would
        # write the text and the newline apart, interleaving ranks that share stdout.
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()
        if args.log:  # O_APPEND: each short line lands whole even with 16 writers
            with open(args.log, "a") as f:
                f.write(msg + "\n")

    torch.set_num_threads(1)  # many CPU ranks share few cores
    # Generous timeout: 16 ranks importing torch on 2 cores start far apart; a dead peer
    # is noticed sooner by gloo (connection reset) and allot's ladder bounds the rest.
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.makedirs(args.ckpt_dir, exist_ok=True)
    rank_file = os.path.join(args.ckpt_dir, f"rank-{rank}.pt")
    done_file = os.path.join(args.ckpt_dir, "complete.json")

    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)  # has state to save
    params = list(model.parameters())
    w_true = torch.linspace(-1.0, 1.0, 16).unsqueeze(1)

    # Resume: complete.json names the step; each rank checks its own file against it,
    # then one all_reduce(MIN) makes it "every rank file exists with that step" and makes
    # all ranks take the same decision (a torn checkpoint means a fresh start for all).
    step, ok, state = 0, 0, None
    try:
        with open(done_file) as f:
            meta = json.load(f)
        state = torch.load(rank_file)
        ok = int(meta["world"] == world and state["step"] == meta["step"])
    except Exception:  # none, torn or foreign: not resumable
        pass
    cand = state["step"] if ok else 0
    agree = torch.tensor([ok, cand, -cand], dtype=torch.int64)
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    if agree[0] == 1 and agree[1] == -agree[2]:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = cand
    elif os.path.exists(done_file) and rank == 0:
        print(f"train.py: incomplete checkpoint in {args.ckpt_dir}; starting fresh", file=sys.stderr)
    say(f"resumed rank={rank} step={step} run={run}")

    while step < args.steps:
        t0 = time.monotonic()
        # The batch depends only on (step, rank): a resumed run sees the same data.
        g = torch.Generator().manual_seed(step * 100003 + rank)
        x = torch.randn(32, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x @ w_true + 0.5)
        opt.zero_grad()
        loss.backward()
        # One collective per step carries the gradients and the stop flag (SUM > 0:
        # some rank got SIGUSR1), so every rank decides to stop at the same step.
        flat = torch.cat(
            [p.grad.flatten() for p in params] + [torch.tensor([float(WARN), float(STOP)])]
        )
        dist.all_reduce(flat)
        if flat[-1] > 0:
            return checkpoint(args, model, opt, step, rank, world, local_rank, run, rank_file, done_file, say)
        if flat[-2] > 0:
            WARN = False
            save(model, opt, step, rank, world, run, rank_file, done_file)
            say(f"warned rank={rank} step={step} run={run}")
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p) / world)
            off += p.numel()
        opt.step()
        step += 1
        if rank == 0:
            say(f"step={step} loss={loss.item():.6f} run={run}")
        time.sleep(max(0.0, PACE_S - (time.monotonic() - t0)))

    # repr of float32 values as Python floats is exact: equal digests, equal weights.
    # (No numpy: `pip install torch` does not bring it.)
    digest = hashlib.sha256(repr([p.tolist() for p in params]).encode()).hexdigest()[:16]
    say(f"done rank={rank} step={step} run={run} weights={digest}")
    dist.destroy_process_group()
    return 0


def save(model, opt, step, rank, world, run, rank_file, done_file):
    def atomic(path, write):  # tmp + fsync + rename: a reader sees the old file or the new
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}
    atomic(rank_file, lambda f: torch.save(state, f))
    dist.barrier()  # every rank file is in place before complete.json names the step
    if rank == 0:
        meta = {"step": step, "world": world, "run": int(run) if run.isdigit() else run}
        atomic(done_file, lambda f: f.write(json.dumps(meta).encode() + b"\n"))
    dist.barrier()  # complete.json is written before anyone reports the checkpoint


def checkpoint(args, model, opt, step, rank, world, local_rank, run, rank_file, done_file, say):
    save(model, opt, step, rank, world, run, rank_file, done_file)
    say(f"checkpointed rank={rank} step={step} run={run}")
    dist.barrier()  # all lines printed before a marker lets allot move on to SIGTERM
    marker_dir = os.environ.get("ALLOT_CHECKPOINT_DIR")
    if local_rank == 0 and marker_dir:
        os.makedirs(marker_dir, exist_ok=True)
        open(os.path.join(marker_dir, "checkpoint.done"), "w").close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown: with torch loaded it costs about a CPU-second per
    # process (~8 s for 16 ranks on 2 cores), and everything is flushed or fsynced.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
