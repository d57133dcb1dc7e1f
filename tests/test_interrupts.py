"""Interrupts without Ray: a step that finishes inside the interrupt is published and seen by
the observers like any other; a first signal lands only where the loop waits; a second one
stops at once."""
from __future__ import annotations

import signal

import pytest

from mindspeed_rl_asp.control.clusters import OrderedCluster
from mindspeed_rl_asp.control.core import ControlConfig, ControlCore, Generate, Publish, TrainStep
from mindspeed_rl_asp.control.loop import Done, Loop, Observer
from mindspeed_rl_asp.runtime.interrupts import Interrupts, interrupt_signals


class Seen(Observer):
    def __init__(self):
        self.submitted_actions, self.done = [], []

    def submitted(self, action, t):
        self.submitted_actions.append(action)

    def observed(self, event, core, t):
        if isinstance(event, Done):
            self.done.append(event.action)


def generations_first(pending):
    """End a generation while there is one; the trainer's work only then."""
    gens = [i for i, a in enumerate(pending) if isinstance(a, Generate)]
    return (gens[0] if gens else 0), False


def core_with_a_step_in_flight():
    config = ControlConfig(num_actors=2, global_batch_size=2, n_samples_per_prompt=1, max_staleness=1,
                           queue_capacity=64, high_watermark=1.0, low_watermark=0.0, total_steps=4)
    core = ControlCore(config, [(f"m{i}", (f"p{i}",)) for i in range(8)])
    seen = Seen()
    cluster = OrderedCluster(generations_first)
    loop = Loop(core, cluster, seen)
    while not any(isinstance(a, TrainStep) for a in core.in_flight()):
        loop.advance()
    return core, cluster, loop, seen


def test_a_step_that_finishes_inside_the_interrupt_is_published_and_observed():
    core, cluster, loop, seen = core_with_a_step_in_flight()
    step = next(a for a in core.in_flight() if isinstance(a, TrainStep)).step
    outcome = loop.interrupt(finish_training=True)
    assert outcome.interrupted
    assert core.trainer_version == core.published_version == step + 1
    # The observers (recorder: the metrics row and spans; checkpointer) saw its Publish like any other.
    assert Publish(step + 1) in seen.submitted_actions and Publish(step + 1) in seen.done
    assert not core.in_flight() and not cluster.pending
    assert all(isinstance(a, Generate) for a in cluster.cancelled)   # generation was cancelled, not waited for


def test_publish_due_is_issued_once_and_only_after_a_step():
    core, cluster, loop, _ = core_with_a_step_in_flight()
    assert core.publish_due() is None            # the step is still training
    train = next(a for a in core.in_flight() if isinstance(a, TrainStep))
    core.on_train_step_done(train.step)
    assert core.publish_due() == Publish(train.step + 1)
    assert core.publish_due() is None            # committed as issued: not twice
    assert Publish(train.step + 1) in core.in_flight()


def test_the_first_signal_waits_for_the_loops_wait():
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            interrupts.handler(signal.SIGTERM, None)   # mid-update: held, nothing torn
            held_until_here = True
            with interrupts.waiting():                 # the wait: it lands now
                pytest.fail("the held signal must land on entering the wait")
    assert held_until_here and interrupts.received == ["SIGTERM"] and not interrupts.repeated


def test_a_held_signal_lands_at_the_end_of_the_loop_body():
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            interrupts.handler(signal.SIGINT, None)
    with interrupts.held():                            # and only once
        pass


def test_a_signal_in_the_wait_lands_at_once():
    interrupts = Interrupts()
    with interrupts.held():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.waiting():
                interrupts.handler(signal.SIGINT, None)


def test_a_second_signal_stops_at_once_even_where_the_first_was_held():
    interrupts = Interrupts()
    interrupts.received.append("SIGTERM")              # the first one, being handled
    with interrupts.held():
        with pytest.raises(KeyboardInterrupt):
            interrupts.handler(signal.SIGTERM, None)
    assert interrupts.repeated


def test_real_signals_go_through_the_installed_handler():
    before = signal.getsignal(signal.SIGTERM)
    with interrupt_signals():
        with pytest.raises(KeyboardInterrupt):        # outside the loop: at once
            signal.raise_signal(signal.SIGTERM)
    with interrupt_signals() as interrupts:
        with interrupts.held():
            signal.raise_signal(signal.SIGINT)         # held: the body goes on
            reached = True
            with pytest.raises(KeyboardInterrupt):     # a second one stops at once
                signal.raise_signal(signal.SIGTERM)
    assert reached and interrupts.received == ["SIGINT", "SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) is before
