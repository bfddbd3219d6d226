"""The bench's noise classifier (bench.quiet): which rounds count, and what a target
may claim from them. Fixed inputs, no timing: the bench itself measures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import quiet

CALM = {"create_p50_us": 20.0, "fsync_p50_us": 150.0, "others_cores": 0.05, "steal_share": 0.0}


def probe(at: float, busy: float, own: float, **changes: float) -> dict[str, float]:
    return {**CALM, "wall_s": at, "busy_s": busy, "own_s": own, **changes}


def test_a_round_between_two_calm_probes_is_quiet() -> None:
    """Calm probes, and during the round only the bench's own CPU: quiet."""
    judged = quiet.judge(probe(0, 100, 10), probe(10, 115, 25))
    assert judged.quiet and judged.why == ()


def test_slow_creates_make_a_round_noisy_and_say_so() -> None:
    """The file system's slow phase at either edge marks the round, with the figure."""
    judged = quiet.judge(probe(0, 0, 0), probe(10, 0, 0, create_p50_us=240.0))
    assert not judged.quiet
    assert judged.why[0].startswith("create 240 µs")


def test_others_cpu_during_the_round_makes_it_noisy() -> None:
    """Non-idle CPU beyond the bench's own (here 1 core for 10 s) is someone else's."""
    judged = quiet.judge(probe(0, 100, 10), probe(10, 125, 15))
    assert not judged.quiet
    assert "others used 2.00 cores during the round" in judged.why


def test_containers_are_judged_by_their_edges_only() -> None:
    """Where the round's work runs outside the bench's processes, its CPU is not held
    against the round; the probes at its edges still are."""
    assert quiet.judge(probe(0, 100, 10), probe(10, 125, 15), own_known=False).quiet
    noisy = quiet.judge(probe(0, 0, 0, steal_share=0.2), probe(10, 0, 0), own_known=False)
    assert not noisy.quiet and noisy.why[0].startswith("steal 20%")


def test_fsync_that_moved_a_lot_during_the_round_makes_it_noisy() -> None:
    """Both edges under the limits, but 3× apart: the round straddled a change."""
    judged = quiet.judge(probe(0, 0, 0, fsync_p50_us=100.0), probe(10, 0, 0, fsync_p50_us=500.0))
    assert not judged.quiet and "fsync moved 100 → 500 µs during the round" in judged.why


def test_a_target_needs_enough_quiet_rounds() -> None:
    """One quiet round of three is inconclusive, however good its figure."""
    out = quiet.decide({0: 1.1, 1: 3.0, 2: 2.8}, {0: True, 1: False, 2: False}, 1.25)
    assert out.status == "inconclusive"
    assert out.used == (0,) and out.note == "1 quiet round, 2 needed"
    assert out.rounds_text() == "1 of 3 rounds quiet (round 1)"


def test_a_target_is_judged_on_the_quiet_rounds_only() -> None:
    """The noisy round's 1.1× does not make a missed target met."""
    out = quiet.decide({0: 2.3, 1: 1.1, 2: 2.4}, {0: True, 1: False, 2: True}, 1.25)
    assert (out.status, out.used) == ("missed", (0, 2))
    assert out.value == pytest.approx(2.35)
    assert out.rounds_text() == "2 of 3 rounds quiet (rounds 1, 3)"


def test_quiet_rounds_that_disagree_are_inconclusive() -> None:
    """One quiet round under the limit and one over: no verdict."""
    out = quiet.decide({0: 1.2, 1: 1.3}, {0: True, 1: True}, 1.25)
    assert out.status == "inconclusive" and out.note == "the quiet rounds disagree"


def test_at_least_targets_and_an_explicit_need() -> None:
    """`≥` targets (a burst rate) and a target that one quiet round may settle."""
    assert quiet.decide({0: 0.9}, {0: True}, 0.8, at_most=False, need=1).status == "met"
    assert quiet.decide({0: 0.3, 1: 0.2}, {0: True, 1: True}, 0.8, at_most=False).status == (
        "missed"
    )


def test_a_strict_limit_is_missed_by_a_value_equal_to_it() -> None:
    """An idle broker measured at exactly 0.1 CPU-s/min misses "< 0.1 CPU-s/min"."""
    assert quiet.decide({0: 0.1}, {0: True}, 0.1, need=1, strict=True).status == "missed"
    assert quiet.decide({0: 0.08}, {0: True}, 0.1, need=1, strict=True).status == "met"
    assert quiet.decide({0: 0.1}, {0: True}, 0.1, need=1).status == "met"


def test_ratios_never_mix_rounds() -> None:
    """A ratio is taken within each round that has both figures."""
    assert quiet.per_round_ratio({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 2: 2.0}) == {0: 2.0, 2: 2.0}


def test_summary_counts_the_reasons() -> None:
    """The run's line about its rounds: how many were quiet, and what made the others noisy."""
    judged = [
        quiet.Judged(True),
        quiet.Judged(False, ("create 90 µs > 60 (before)", "create 80 µs > 60 (after)")),
        quiet.Judged(False, ("others used 1.20 cores during the round",)),
    ]
    assert quiet.summary(judged) == "1 of 3 rounds quiet (noisy: create ×1, others ×1)"


def test_rounds_are_named_by_their_number_in_the_run() -> None:
    """A target measured in the run's rounds 4 and 5 (indices 3, 4), one of them quiet,
    says which by the run's numbering and how many of its own rounds there were."""
    out = quiet.decide({3: 0.25, 4: 0.24}, {3: False, 4: True}, 0.8, at_most=False)
    assert out.rounds_text() == "1 of 2 rounds quiet (round 5)"


def test_a_containers_round_is_probed_once_the_engine_settles(tmp_path: Path) -> None:
    """Around a round whose work ran in containers, each probe waits for the engine's
    teardown of the last ones and records the wait, so that the engine's work for the
    bench's own containers is not taken for others' CPU; a round of the bench's own
    processes is probed at once."""
    from bench.rounds import Run

    run = Run(tmp_path)
    with run.round("start", own_known=False):
        pass
    with run.round("sequential"):
        pass
    containers, own = run.rounds
    assert containers.before["engine_settle_s"] >= 0.1  # at least one idle step
    assert containers.after["engine_settle_s"] >= 0.1
    assert "engine_settle_s" not in own.before and "engine_settle_s" not in own.after
