"""Data-parallel calibration on ``torch.distributed``: what the rest of quantkit needs to know.

Every rank holds the whole model and the whole calibration set, builds the same batches, and
runs only the batches it owns (``owned_batches``) through each layer; the layer's outputs,
the next layer's inputs, stay on the rank that computed them. Whatever a step accumulates
over batches is merged before it is used: GPTQ's Hessians as token-weighted means
(``merge_mean``), static activation ranges as maxima (``merge_max``). So every rank solves
every linear from the same statistics and holds the same quantized layer; rank 0 alone writes
(``is_writer``).

Outside a process group (one rank) every helper is the identity, so the single-process path
is exactly what it was. The backend follows the device: gloo on the CPU, NCCL on GPUs, one
code path (``initialize``).

Example (2 ranks, 5 batches):
    >>> owned_batches(5, rank=0, world=2), owned_batches(5, rank=1, world=2)
    ([0, 2, 4], [1, 3])
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from quantkit.errors import QuantkitError
from quantkit.common.process import die_with_parent
from quantkit.config.validation import short
import socket



def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_writer() -> bool:
    """Rank 0 writes the checkpoint, its logs and the report; the other ranks only compute."""
    return rank() == 0


def launched_ranks() -> int:
    """The world size torchrun gave this process (1 when it was not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def initialize(device: str) -> str:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``);
    returns the device this rank computes on (``cuda`` becomes ``cuda:<LOCAL_RANK>``).

    Gloo on the CPU, NCCL on GPUs: everything else is the same code path."""
    if launched_ranks() <= 1 or dist.is_initialized():
        return device
    # a rank outlives nothing: when torchrun's agent dies (even by SIGKILL), the rank is stopped
    die_with_parent(os.getppid())
    cuda = device.startswith("cuda")
    if cuda and device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    return device


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def owned_batches(count: int, rank: int, world: int) -> list[int]:
    """The calibration batches rank ``rank`` of ``world`` runs: every ``world``-th from its own.

    Batches are made first-fit decreasing, so neighbours have similar sizes and a stride
    balances the ranks' tokens better than contiguous slices would."""
    if world > count:
        raise QuantkitError(f"--nproc: {world} ranks but only {count} calibration batch"
                            f"{'es' if count != 1 else ''} to share; use at most {count} ranks or more calibration data")
    return list(range(rank, count, world))


def _comm_device(t: torch.Tensor) -> torch.device:
    # NCCL reduces only CUDA tensors (a Hessian kept on the CPU with offload_hessians travels)
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def merge_mean(mean: torch.Tensor, count: int) -> tuple[torch.Tensor, int]:
    """The mean over every rank's tokens of a statistic each rank holds as a running mean over
    its own ``count`` tokens: ``sum_r count_r * mean_r / sum_r count_r``, and that total.

    Summed in float64, so the merged mean differs from one rank's running mean over all
    tokens only by the running mean's own float32 rounding. Returns a new tensor."""
    if world_size() == 1:
        return mean, count
    dev = _comm_device(mean)
    total = torch.tensor([float(count)], dtype=torch.float64, device=dev)
    weighted = mean.to(dev, torch.float64) * float(count)
    dist.all_reduce(total)
    dist.all_reduce(weighted)
    n = int(total.item())
    out = weighted / n if n > 0 else torch.zeros_like(weighted)
    return out.to(mean.device, mean.dtype), n


def merge_max(values: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """Per name, the maximum over ranks of a non-negative statistic (an absmax); a name no rank
    observed stays absent. ``names`` must be the same list, in the same order, on every rank."""
    if world_size() == 1 or not names:
        return values
    local = [values.get(n) for n in names]
    like = next((v for v in local if v is not None), torch.zeros(()))
    dev = _comm_device(like)
    # one scalar per name; -1 marks "not observed here" (an absmax is >= 0)
    flat = torch.stack([(v.float().amax() if v is not None else torch.tensor(-1.0)).to(dev) for v in local])
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    return {n: flat[k].to(like.device) for k, n in enumerate(names) if float(flat[k]) >= 0}


def merge_sum(counts: list[int]) -> list[int]:
    """Every rank's ``counts`` summed position by position (tokens per expert: each rank saw
    its own batches). ``counts`` must have the same length on every rank."""
    if world_size() == 1:
        return counts
    t = torch.tensor(counts, dtype=torch.int64, device=_comm_device(torch.zeros(())))
    dist.all_reduce(t)
    return [int(v) for v in t.tolist()]


def smallest(value: int) -> int:
    """The smallest of every rank's ``value``: one decision all ranks take (a batch size read
    from each rank's free memory could otherwise differ, and with it the batches)."""
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device(torch.zeros(())))
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def parse_nproc(text: str | None, device: str = "cpu") -> int | None:
    """``--nproc``: a whole number of ranks, at least 1 and at most ``rank_capacity(device)``
    (None when not given). More ranks than CPUs (or GPUs) is refused before any starts: each
    rank holds the whole model, so oversubscribed ranks only add memory and contend for cores."""
    if text is None:
        return None
    try:
        n = int(text.strip())
    except ValueError:
        n = 0
    if n < 1 or str(n) != text.strip().lstrip("+"):
        raise QuantkitError(f"--nproc: expected a whole number of ranks >= 1, got {short(text)}")
    capacity, what = rank_capacity(device)
    if n > capacity:
        unit = "GPU" if device.startswith("cuda") else "CPU"
        raise QuantkitError(f"--nproc: {n} ranks, but this process may use {capacity} {what} "
                            f"(the limit: at most one rank per {unit})")
    return n


def rank_capacity(device: str) -> tuple[int, str]:
    """How many ranks ``device`` can run side by side, and what they are counted in: the GPUs
    torch sees for ``cuda``, else the CPUs this process may run on (its affinity mask, which a
    container's or ``taskset``'s CPU set narrows; not ``os.cpu_count()``)."""
    if device.startswith("cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return n, "GPUs" if n != 1 else "GPU"
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # no affinity call on this platform
        n = os.cpu_count() or 1
    return n, "CPUs" if n != 1 else "CPU"


def launch_argv(nproc: int, argv: list[str], port: int, log_dir: str | None = None) -> list[str]:
    """The torchrun command that runs ``argv`` (quantkit's arguments, ``--nproc`` dropped) on
    ``nproc`` local ranks; torchrun keeps its logs in ``log_dir`` (None: a folder of its own in
    TMPDIR, which it leaves behind when stopped)."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            args.append(a)
    logs = ["--log-dir", log_dir] if log_dir is not None else []
    return ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(port), *logs, "-m", "quantkit", *args]


def free_port() -> int:

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
