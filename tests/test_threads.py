"""The worker's thread count: fewer while the machine is busy, back up when it has room, never a slower count kept.

`Threads` runs on made-up clocks here: each pass "takes" what the test says it
takes at the count in use, and the worker is "on a CPU" for the share the test
says. One test runs it under the real scheduler on the stand-in forward.
"""

from __future__ import annotations

import pytest

from serge.engine.generation.batching import threads as t
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.batching.scheduler import Scheduler
from serge.engine.generation.batching.threads import Threads, ladder
from serge.engine.local import eos_ids
from tests.standin import StandInForward, shared_tokenizer


class Machine:
    """Clocks for `Threads`: a pass at n threads takes `seconds[n]`, of which the worker is on a CPU `share[n]`."""

    def __init__(self, seconds: dict[int, float], share: dict[int, float]) -> None:
        self.seconds, self.share = seconds, share
        self.now = self.cpu = 0.0
        self.count = max(seconds)
        self.applied: list[int] = []
        self.reported: list[int] = []

    def apply(self, n: int) -> None:
        self.count = n
        self.applied.append(n)

    def threads(self, counts: list[int]) -> Threads:
        return Threads(counts, self.apply, self.reported.append, clock=lambda: self.now, cpu_clock=lambda: self.cpu)

    def run(self, threads: Threads, passes: int, sequences: int = 4) -> list[int]:
        """The count each pass ran on."""
        used = []
        for _ in range(passes):
            with threads.decode(sequences):
                used.append(self.count)
                self.now += self.seconds[self.count]
                self.cpu += self.seconds[self.count] * self.share[self.count]
        return used


def test_the_counts_halve_from_the_configured_one():
    assert ladder(8) == [8, 4, 2, 1]
    assert ladder(6) == [6, 3, 1]
    assert ladder(1) == [1]


def test_a_busy_machine_drops_to_fewer_threads_when_they_are_faster():
    # as measured on 2 cores at load 6.7: 3.9 s a step on 2 threads, 0.25 s on 1
    machine = Machine(seconds={2: 3.9, 1: 0.25}, share={2: 0.25, 1: 0.55})
    threads = machine.threads([2, 1])
    used = machine.run(threads, 20)
    assert used[:2] == [2, 1]  # one pass (3.9 s: more than a second) to learn from, then the try
    assert threads.current == 1
    assert used[-10:] == [1] * 10  # on 1 the worker is still starved, but there is nothing lower to try
    assert machine.reported == [2, 1]


def test_a_count_tried_is_dropped_when_it_is_not_clearly_faster():
    machine = Machine(seconds={2: 0.10, 1: 0.095}, share={2: 0.5, 1: 0.9})  # starved, but 1 thread no help
    threads = machine.threads([2, 1])
    used = machine.run(threads, 60)
    assert threads.current == 2
    assert 1 in used  # it was tried...
    assert used.count(1) <= 4  # ...after 1, 2, 4 seconds of passes, given up each time
    assert machine.applied[-1] == 2
    assert machine.reported == [2]


def test_an_idle_machine_goes_back_up_and_a_busy_one_is_tried_ever_more_rarely():
    machine = Machine(seconds={2: 0.05, 1: 0.08}, share={2: 1.0, 1: 1.0})  # idle: 2 threads are faster
    threads = machine.threads([2, 1])
    threads._at = 1  # say a busy spell had brought it down to 1
    machine.count = 1
    used = machine.run(threads, 40)
    assert threads.current == 2 and used[-1] == 2
    assert machine.reported == [2, 2]

    busy = Machine(seconds={2: 2.0, 1: 0.25}, share={2: 0.3, 1: 1.0})  # room on 1 core only: 2 threads crawl
    threads = busy.threads([2, 1])
    threads._at, busy.count = 1, 1
    used = busy.run(threads, 500)  # 125 s of passes on 1 thread
    tries = used.count(2)
    assert threads.current == 1
    assert 2 <= tries <= 7  # after 1, 2, 4, ... 64 s of passes: not one in every second
    assert t.MOST_WAIT_S == 64.0


def test_a_pass_that_raises_during_a_try_goes_back_to_the_count_in_use():
    machine = Machine(seconds={2: 1.0, 1: 0.2}, share={2: 0.3, 1: 0.9})
    threads = machine.threads([2, 1])
    machine.run(threads, 1)  # learn
    with pytest.raises(RuntimeError):
        with threads.decode(4):
            assert machine.count == 1  # the try
            raise RuntimeError("pass failed")
    assert machine.count == 2 and threads.current == 2


def test_one_count_is_never_changed():
    machine = Machine(seconds={2: 3.9}, share={2: 0.1})
    threads = machine.threads([2])
    assert machine.run(threads, 10) == [2] * 10
    assert machine.applied == []


class _Crowded(StandInForward):
    """A forward on a crowded machine: a pass sleeps (off the CPU) 20 ms on 2 threads, 4 ms on 1."""

    def __init__(self) -> None:
        super().__init__(reply_tokens=None, step_s=0.0)
        self.count = 2

    def set_threads(self, n: int) -> None:
        super().set_threads(n)
        self.count = n

    def decode(self, kvs, tokens):
        self.step_s = 0.02 if self.count == 2 else 0.004
        return super().decode(kvs, tokens)


def test_the_scheduler_runs_its_passes_on_fewer_threads_when_the_machine_is_crowded():
    forward, tokenizer = _Crowded(), shared_tokenizer()
    scheduler = Scheduler(forward, tokenizer, eos_ids(tokenizer), 2, "crowded")
    try:
        text = "".join(scheduler.submit(tokenizer.encode("hello"), SamplingParams(max_new_tokens=80, temperature=0, ignore_eos=True).resolved(1000)))
        assert text
        assert forward.threads[-1] == 1 and forward.count == 1
        assert scheduler.metrics.registry.get_sample_value("serge_worker_threads", {"model": "crowded"}) == 1
    finally:
        scheduler.close()


def _topology(root, siblings: dict[int, str]):
    for cpu, mask in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings").write_text(mask + "\n")
    return root


def test_the_default_thread_count_is_one_per_physical_core_as_llama_cpp_counts_them(tmp_path):
    from serge.settings import physical_cores

    smt = _topology(tmp_path / "smt", {0: "3", 1: "3", 2: "c", 3: "c"})  # 2 cores, 2 threads each
    assert physical_cores({0, 1, 2, 3}, smt) == 2
    assert physical_cores({0, 2}, smt) == 2  # one thread of each core usable: still both cores
    lone = _topology(tmp_path / "lone", {0: "1", 1: "2"})  # a 2-vCPU machine, one thread per core
    assert physical_cores({0, 1}, lone) == 2
    assert physical_cores({1}, lone) == 1


def test_without_a_readable_topology_the_count_is_llama_cpps_guess(tmp_path):
    from serge.settings import physical_cores

    assert physical_cores({0, 1}, tmp_path) == 2
    assert physical_cores(set(range(16)), tmp_path) == 8
