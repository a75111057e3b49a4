"""Rank layout, the memory-balance rule, error sharing and the agreed resize, in one process
(the 2-rank runs are in test_ranks_distributed)."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest

from app.parallel_setup import check_layout, check_local_rank, parallel_state_resource
from kvcache.runtime.agreed_resize import agree_on_resize, capped_resize
from kvcache.byte_units import GiB, MiB
from kvcache.errors import ConfigError, DoesNotFitError, RankFailedError, RankLostError, UnbalancedMemoryError
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.inputs.parallel import ParallelState, group_ranks
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest
from kvcache.inputs.rank_agreement import RankAgreement, _failure_of, check_memory_balance
from kvcache.runtime.resize import compute_post_capture_kv_resize
from kvcache.inputs.server_args import ServerArgs

NAMES = ("rank 0", "rank 1", "rank 2")


def test_groups_lay_tp_innermost_as_sglang_does() -> None:
    # 8 ranks: 2 stages of TP 4; attention DP 2 splits each stage's TP into two pairs
    assert group_ranks(tp_size=4, pp_size=2, attention_dp_size=2) == {
        "tp": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "attention_tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "attention_dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
    }


def test_a_rank_knows_its_place_layers_and_heads() -> None:
    p = ParallelState(tp_size=4, tp_rank=3, pp_size=2, pp_rank=1, attention_dp_size=2)
    assert (p.rank, p.world_size, p.attention_tp_rank, p.attention_dp_rank) == (7, 8, 1, 1)
    assert p.describe() == "rank 7 (tp 3/4, pp 1/2)"
    assert p.layer_range(31) == range(15, 31) and p.heads_per_rank(8) == 4  # 15 + 16: the last stage takes the extra layer
    assert not p.is_distributed and p.min_across_ranks(123) == 123


def test_the_world_must_be_tp_times_pp() -> None:
    check_layout(4, ServerArgs(tp_size=2, pp_size=2))
    with pytest.raises(ConfigError, match=r"launcher started 2 ranks but --tp-size 2 x --pp-size 2 = 4; launch 4 "):
        check_layout(2, ServerArgs(tp_size=2, pp_size=2))


def test_each_local_rank_needs_its_own_gpu() -> None:
    check_local_rank(1, 2)
    with pytest.raises(ConfigError, match=r"local rank 2 needs GPU 2, but torch sees 2 CUDA device\(s\).*--nproc-per-node 2"):
        check_local_rank(2, 2)


def test_a_torchrun_world_that_is_not_the_layout_is_refused_before_joining() -> None:
    resource = parallel_state_resource(ServerArgs(tp_size=2), environ={"WORLD_SIZE": "3", "RANK": "0"})
    with pytest.raises(ConfigError, match="launcher started 3 ranks but --tp-size 2 x --pp-size 1 = 2"):
        next(resource)


def test_a_group_that_fails_part_way_leaves_the_groups_made_before_it_destroyed(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.parallel_setup as setup

    made: list[object] = []
    destroyed: list[object] = []

    def new_group(ranks: list[int], **_: object) -> object:
        if len(made) == 2:
            raise RuntimeError("new_group failed")
        made.append(object())
        return made[-1]

    monkeypatch.setattr(setup.dist, "is_initialized", lambda: True)  # an embedding engine's group: not ours to destroy
    monkeypatch.setattr(setup.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(setup.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(setup.dist, "new_group", new_group)
    monkeypatch.setattr(setup.dist, "destroy_process_group", lambda group=None: destroyed.append(group))
    with pytest.raises(RuntimeError, match="new_group failed"):
        next(parallel_state_resource(ServerArgs(), environ={}))
    assert destroyed == made[::-1]


def test_a_local_rank_that_is_not_a_number_is_a_config_error() -> None:
    resource = parallel_state_resource(ServerArgs(tp_size=2, device="cpu"),
                                       environ={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"})
    with pytest.raises(ConfigError, match="LOCAL_RANK='x' from the launcher is not a number"):
        next(resource)


def _alone(rank: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """torchrun's environment for `rank` of a 2-rank world whose other rank never comes (a 0.5 s rendezvous)."""
    import app.parallel_setup as setup
    from rank_worker import free_port

    monkeypatch.setattr(setup, "RENDEZVOUS_TIMEOUT", timedelta(seconds=0.5))
    return {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def test_a_rank_whose_rank_0_never_comes_stops_at_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    # rank 0, which serves the store, died (or was never started) before the process group formed
    resource = parallel_state_resource(ServerArgs(tp_size=2, device="cpu"), environ=_alone(1, monkeypatch))
    with pytest.raises(RankLostError, match=r"rank 1 could not join rank 0 at 127\.0\.0\.1:\d+ within 0.5 s: another rank "
                       r"failed before the process group formed.*\[nothing listened at 127\.0\.0\.1:\d+\]$"):
        next(resource)


def test_a_rendezvous_port_already_taken_is_a_config_error_not_a_lost_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    environ = _alone(0, monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(environ["MASTER_PORT"])))
        taken.listen()
        resource = parallel_state_resource(ServerArgs(tp_size=2, device="cpu"), environ=environ)
        with pytest.raises(ConfigError, match=r"rank 0 could not serve the ranks' rendezvous at 127\.0\.0\.1:\d+ "
                           r"\[.*address already in use.*\]; launch with a free port"):
            next(resource)


def test_a_master_port_that_is_not_a_port_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {**_alone(1, monkeypatch), "MASTER_PORT": "70000"}
    resource = parallel_state_resource(ServerArgs(tp_size=2, device="cpu"), environ=environ)
    with pytest.raises(ConfigError, match=r"MASTER_PORT=70000 from the launcher is not a TCP port; give one in 1-65535"):
        next(resource)


def test_under_torchruns_agent_its_store_is_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun serves the store on MASTER_PORT itself (and ends every worker when one exits): no second store
    import app.parallel_setup as setup

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(setup, "_rendezvous", lambda *a, **k: pytest.fail("a second store under torchrun"))
    monkeypatch.setattr(setup.dist, "init_process_group", lambda **kw: calls.append(kw))
    environ = {**_alone(0, monkeypatch), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert setup._init_default_group(ServerArgs(tp_size=2, device="cpu"), environ) == 0
    assert [c["init_method"] for c in calls] == ["env://"]


@pytest.mark.parametrize("agent_store", [False, True])
def test_a_rank_lost_while_the_group_forms_is_rank_lost(agent_store: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its own store or torchrun's agent store (where it escaped as a traceback)."""
    import app.parallel_setup as setup

    def lost(**_: object) -> None:
        raise setup.dist.DistNetworkError("Failed to recv, got 0 bytes\n<C++ trace>")

    class Store:
        def set_timeout(self, _: object) -> None:
            pytest.fail("the group never formed")

    monkeypatch.setattr(setup, "_rendezvous", lambda *a, **k: Store())
    monkeypatch.setattr(setup.dist, "init_process_group", lost)
    environ = {**_alone(1, monkeypatch), **({"TORCHELASTIC_USE_AGENT_STORE": "True"} if agent_store else {})}
    with pytest.raises(RankLostError, match=r"^rank 1: another rank went away while the process group formed .*"
                       r"\[Failed to recv, got 0 bytes\]$"):
        setup._init_default_group(ServerArgs(tp_size=2, device="cpu"), environ)


def test_rank_0_says_rank_lost_in_one_line_when_another_rank_never_joins(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    for name, value in _alone(0, monkeypatch).items():
        monkeypatch.setenv(name, value)
    assert main(["bootstrap", "--device", "cpu", "--tp-size", "2", "--kv-cache-memory", "16MiB"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: rank lost: rank 0 waited 0.5 s for all 2 ranks to join")


def test_one_process_plans_rank_0_alone() -> None:
    (state,) = list(parallel_state_resource(ServerArgs(tp_size=8, pp_size=2), environ={}))
    assert (state.rank, state.pp_rank, state.groups) == (0, 0, None)


@pytest.mark.parametrize("free", [(10 * GiB, 9 * GiB), (9 * GiB, 9 * GiB, 10 * GiB)])
def test_ninety_percent_of_the_largest_is_balanced(free: tuple[int, ...]) -> None:
    check_memory_balance(free, 0.9, NAMES)  # 9/10 is exactly SGLang's threshold


def test_below_the_ratio_every_rank_is_named_with_its_bytes() -> None:
    free = (80 * GiB, 80 * GiB, 60 * GiB)
    with pytest.raises(UnbalancedMemoryError) as info:
        check_memory_balance(free, 0.9, NAMES)
    err = info.value
    assert "rank 0 80.00 GiB (85,899,345,920 B), rank 1 80.00 GiB (85,899,345,920 B), rank 2 60.00 GiB" in str(err)
    assert "the smallest is 75% of the largest" in str(err) and "memory on rank 2" in str(err)
    assert (err.needed_bytes, err.available_bytes) == (72 * GiB, 60 * GiB)
    suggested = float(err.suggestions[1].split()[1])
    assert suggested == 0.75
    check_memory_balance(free, suggested, NAMES)  # the suggested ratio really passes


def test_a_ratio_of_zero_turns_the_check_off() -> None:
    check_memory_balance((GiB, 1), 0.0, NAMES)


def test_one_rank_agrees_with_itself_and_raises_its_own_error() -> None:
    alone = RankAgreement.alone()
    assert alone.min_int64((5, 7)) == (5, 7) and alone.gather_int64((5,)) == ((5,),)
    memory = alone.agree_on_memory(free_before_load=10, free_after_load=8, total_bytes=12, device_capacity_bytes=13)
    assert (memory.free_before_load, memory.free_after_load, memory.total, memory.device_capacity) == (10, 8, 12, 13)
    error = DoesNotFitError("too big", needed_bytes=2, available_bytes=1)

    def fail() -> None:
        raise error

    with pytest.raises(DoesNotFitError) as info:
        alone.run_everywhere(fail)
    assert info.value is error


def test_a_typed_error_travels_to_other_ranks_as_the_same_type_and_numbers() -> None:
    original = DoesNotFitError("the pool does not fit", needed_bytes=3 * GiB, available_bytes=GiB,
                               suggestions=("--kv-cache-memory 1GiB",))
    travelled = pickle.loads(pickle.dumps(_failure_of(original, rank=1)))
    rebuilt = travelled.error("rank 1 (tp 1/2, pp 0/1)")
    assert type(rebuilt) is DoesNotFitError
    assert str(rebuilt) == "rank 1 (tp 1/2, pp 0/1): " + str(original)
    assert (rebuilt.needed_bytes, rebuilt.available_bytes, rebuilt.suggestions) == (3 * GiB, GiB, ("--kv-cache-memory 1GiB",))


def test_an_error_that_is_not_ours_reaches_other_ranks_as_rank_failed() -> None:
    rebuilt = _failure_of(RuntimeError("boom"), rank=0).error("rank 0")
    assert isinstance(rebuilt, RankFailedError) and str(rebuilt) == "rank 0: RuntimeError: boom"


def test_a_rank_that_would_keep_more_after_capture_keeps_the_smallest_count() -> None:
    budget = MemoryBudget(budget_bytes=64 * MiB, total_bytes=GiB, free_before_load_bytes=GiB,
                          free_after_load_bytes=GiB - 8 * MiB, mem_fraction_static=0.9, kv_cache_memory_bytes=None)
    plan = plan_pool_sizes(PlanRequest(
        budget=budget, page_size=16, context_length=256, req_to_token_row_width=256, max_running_requests=8,
        kv_pools=(KVPoolDemand(name="full", kind="full", num_layers=2, bytes_per_token=512),)))
    unchanged = compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=GiB, headroom_bytes=0)
    agreed = plan.max_total_num_tokens // 2 // 16 * 16  # another rank (a longer stage) shrank to half
    capped = capped_resize(unchanged, agreed)
    assert capped.tokens_after == agreed and capped.changed and capped.before == plan
    assert capped.after.max_running_requests == plan.max_running_requests
    assert capped.after.total_bytes < plan.total_bytes
    assert capped_resize(unchanged, plan.max_total_num_tokens) is unchanged
    assert agree_on_resize(capped, RankAgreement.alone()) is capped
