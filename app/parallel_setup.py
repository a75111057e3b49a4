"""ParallelState as a container Resource: join or start the process group, build the groups, tear down.

Three cases, decided once at start-up:
- torch.distributed is already initialised (an engine embedding us, a test): use it,
  and never destroy the default group this resource did not create;
- torchrun launched this process (its standard RANK / WORLD_SIZE / LOCAL_RANK /
  MASTER_ADDR / MASTER_PORT, the launcher's rendezvous protocol): initialise the
  default group (NCCL for CUDA, gloo otherwise) and destroy it at shutdown;
- neither: one process planning rank 0 of the layout, with no groups.

The world must be exactly --tp-size x --pp-size ranks. The subgroups this resource
creates (TP, PP, attention TP/DP, and the gloo group the ranks agree over) are
destroyed at shutdown in every case.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from app.launcher_env import launched_world_size, launcher_int
from app.plan_wiring import single_process_state
from kvcache.errors import ConfigError, RankLostError
from kvcache.inputs.parallel import ParallelState, ProcessGroups, group_ranks
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.devices import resolve_device
from kvcache.memory.torch_collectives import TorchRankGroup

# How long a rank waits for the others at one collective before giving up (torch's default is 10 minutes;
# a start-up step that takes this long means a rank died).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# How long the ranks wait for each other to join the process group. torchrun starts its workers together and
# kills the rest when one exits, so a rank missing for this long failed before joining, or was never started;
# waiting out the collective timeout instead would keep the others hung for minutes.
RENDEZVOUS_TIMEOUT = timedelta(minutes=2)


def check_layout(world_size: int, server_args: ServerArgs) -> None:
    """The ranks that exist must be the ranks the layout asks for."""
    a = server_args
    if world_size != a.tp_size * a.pp_size:
        raise ConfigError(
            f"the launcher started {world_size} ranks but --tp-size {a.tp_size} x --pp-size {a.pp_size} = "
            f"{a.tp_size * a.pp_size}; launch {a.tp_size * a.pp_size} processes (torchrun --nproc-per-node "
            f"{a.tp_size * a.pp_size}) or choose sizes whose product is {world_size} (e.g. --tp-size {world_size} --pp-size 1)"
        )


def check_local_rank(local_rank: int, device_count: int) -> None:
    """One GPU per process: this host must have a GPU for every local rank."""
    if local_rank >= device_count:
        raise ConfigError(
            f"local rank {local_rank} needs GPU {local_rank}, but torch sees {device_count} CUDA device(s) on this host; "
            f"launch at most {device_count} processes per node (torchrun --nproc-per-node {device_count})"
        )


def _init_default_group(server_args: ServerArgs, environ: Mapping[str, str]) -> int:
    """Initialise the default group from torchrun's environment; returns the local rank."""
    local_rank = launcher_int(environ, "LOCAL_RANK", 0)
    backend = "gloo"
    if resolve_device(server_args.device).type == "cuda":
        check_local_rank(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    rank, world_size = launcher_int(environ, "RANK", 0), launched_world_size(environ)
    # torchrun's agent serves the store on MASTER_PORT and ends every worker when one exits: its rendezvous
    agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = None if agent_store else _rendezvous(environ, world_size=world_size, rank=rank)
    try:
        if store is None:
            dist.init_process_group(backend=backend, init_method="env://", timeout=COLLECTIVE_TIMEOUT)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                                    timeout=COLLECTIVE_TIMEOUT)
    except dist.DistError as exc:  # a rank that joined the store went away before the group formed
        raise RankLostError(f"rank {rank}: another rank went away while the process group formed (its own output "
                            f"says why); nothing is allocated here [{_first_line(exc)}]") from None
    if store is not None:
        store.set_timeout(COLLECTIVE_TIMEOUT)  # joined: from here on a rank that is slow is not missing
    return local_rank


def _first_line(exc: BaseException) -> str:
    """The first line of a torch.distributed error (its C++ trace follows), at most 160 characters."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]


def _wait_for_rank_zero(host: str, port: int, *, deadline: float) -> None:
    """Poll until rank 0's store accepts connections (TimeoutError at `deadline`). torch's own client retries too,
    but logs a C++ stack trace to stderr on every failed try; an operator must see one line."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listened at {host}:{port}") from None
            time.sleep(0.2)


def _rendezvous(environ: Mapping[str, str], *, world_size: int, rank: int) -> dist.TCPStore:
    """Every rank meets at torchrun's MASTER_ADDR:MASTER_PORT (rank 0 serves the store), waiting at most
    RENDEZVOUS_TIMEOUT for the others: a rank that never comes is RankLostError (exit 4), not a hang."""
    host = environ.get("MASTER_ADDR", "127.0.0.1")
    port = launcher_int(environ, "MASTER_PORT", 29500)
    if not 1 <= port <= 65535:
        raise ConfigError(f"MASTER_PORT={port} from the launcher is not a TCP port; give one in 1-65535 (29500, say)")
    waited = f"{RENDEZVOUS_TIMEOUT.total_seconds():g}"
    try:
        if rank != 0:
            _wait_for_rank_zero(host, port, deadline=time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds())
        return dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=RENDEZVOUS_TIMEOUT,
                             wait_for_workers=True)
    except (dist.DistError, TimeoutError) as exc:
        reason = _first_line(exc)
        if rank == 0 and isinstance(exc, dist.DistNetworkError):  # rank 0 could not listen: no rank was lost
            raise ConfigError(f"rank 0 could not serve the ranks' rendezvous at {host}:{port} [{reason}]; "
                              "launch with a free port (torchrun --master-port 29511, say)") from None
        joining = (f"waited {waited} s for all {world_size} ranks to join at {host}:{port}" if rank == 0 else
                   f"could not join rank 0 at {host}:{port} within {waited} s")
        raise RankLostError(
            f"rank {rank} {joining}: another rank failed before the process group formed, or was never started "
            f"(its own output says why; with torchrun check every node's launcher); nothing is allocated here "
            f"[{reason}]") from None


def _new_groups(server_args: ServerArgs, rank: int, created: list[object]) -> ProcessGroups:
    """Every group kind; new_group is called for every group on every rank, in the same order.
    Each group this rank belongs to goes into `created` as soon as it exists, so a failure part-way
    leaves the caller what to destroy."""
    layout = group_ranks(tp_size=server_args.tp_size, pp_size=server_args.pp_size,
                         attention_dp_size=server_args.attention_dp_size)
    mine: dict[str, object] = {}
    for kind, groups in layout.items():
        for ranks in groups:
            group = dist.new_group(ranks, timeout=COLLECTIVE_TIMEOUT)
            if rank in ranks:  # torch hands non-members a placeholder, nothing to destroy
                mine[kind] = group
                created.append(group)
    agreement = dist.new_group(list(range(dist.get_world_size())), backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    created.append(agreement)
    return ProcessGroups(agreement=TorchRankGroup(agreement, dist.get_world_size()), **mine)  # type: ignore[arg-type]


def parallel_state_resource(server_args: ServerArgs, environ: Mapping[str, str] | None = None) -> Iterator[ParallelState]:
    env = os.environ if environ is None else environ
    a = server_args
    owns_default_group = False
    local_rank = 0
    if not dist.is_initialized():
        world = launched_world_size(env)
        if world == 1:  # one process: rank 0 of the layout, planned alone
            yield single_process_state(a)
            return
        check_layout(world, a)
        local_rank = _init_default_group(a, env)
        owns_default_group = True
    created: list[object] = []
    try:
        check_layout(dist.get_world_size(), a)
        rank = dist.get_rank()
        if not owns_default_group:
            local_rank = launcher_int(env, "LOCAL_RANK", rank)
        groups = _new_groups(a, rank, created)
        yield ParallelState(
            tp_size=a.tp_size, tp_rank=rank % a.tp_size, pp_size=a.pp_size, pp_rank=rank // a.tp_size,
            pp_layer_partition=a.pp_layer_partition,
            attention_dp_size=a.attention_dp_size, local_rank=local_rank, groups=groups,
            min_rank_memory_ratio=a.min_rank_memory_ratio,
        )
    finally:
        for group in reversed(created):
            dist.destroy_process_group(group)
        if owns_default_group:
            dist.destroy_process_group()
