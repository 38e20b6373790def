"""The rollout core's GroupBook, as the trainer's GroupAssembler and the simulator both keep
their groups in it: open with the seed rule, complete on the last sample, ready by iteration in
completion order, taken whole up to a limit, reopened when samples must be generated again."""

import zlib

from streamrl.rollout.work import GroupBook, PromptWork


def _prompts(*ids: str) -> list[PromptWork]:
    return [PromptWork(pid, k, "", (1,)) for k, pid in enumerate(ids)]


def test_each_prompt_draws_from_the_run_seed_and_its_own_id():
    book: GroupBook[int] = GroupBook(seed=7)
    a, b = book.open(0, _prompts("0-0-3", "0-1-9"), group_size=2, min_policy_version=0)
    assert a.seed == (7 << 32) + zlib.crc32(b"0-0-3") and b.seed == (7 << 32) + zlib.crc32(b"0-1-9")
    assert GroupBook(seed=7).open(5, _prompts("0-0-3"), 4, 1)[0].seed == a.seed  # any start, any replica


def test_a_group_is_ready_once_complete_and_groups_are_taken_by_iteration_in_completion_order():
    book: GroupBook[str] = GroupBook()
    book.open(0, _prompts("p0", "p1", "p2"), 2, 0)
    book.open(1, _prompts("q0"), 2, 1)
    assert book.add("p1", 1, "p1/1") is False
    assert book.get("p1").received == {1: "p1/1"} and not book.finished("p1")
    assert book.add("p1", 0, "p1/0") is True  # complete: ready, no longer in flight
    assert book.get("p1") is None and book.finished("p1")
    book.add("q0", 0, "q")
    book.add("q0", 1, "q")
    book.add("p0", 0, "p0/0")
    book.add("p0", 1, "p0/1")
    assert (book.ready_samples(0), book.ready_samples(1), book.num_inflight, book.num_groups_ready) == (4, 2, 1, 3)
    taken = book.take(0, max_samples=2)  # at most 2 samples: one group
    assert [g.prompt_id for g in taken] == ["p1"] and taken[0].in_order() == ["p1/0", "p1/1"]
    assert [g.prompt_id for g in book.take(0, max_samples=100)] == ["p0"]
    assert book.take(0, max_samples=100) == [] and book.ready_samples(0) == 0
    assert [g.prompt_id for g in book.take(1, max_samples=1)] == ["q0"]  # a group is never split


def test_a_reopened_group_is_in_flight_again_without_the_samples_it_dropped():
    book: GroupBook[int] = GroupBook()
    (task,) = book.open(0, _prompts("p0"), 3, 0)
    for i in range(3):
        book.add("p0", i, 10 + i)
    assert book.take(0, 3, keep=lambda t: False) == []  # refused: not taken, its keeper reopens it
    book.reopen(task, [0, 2], min_policy_version=4)
    assert book.get("p0") is task and not book.finished("p0")
    assert task.received == {1: 11} and task.min_policy_version == 4
    assert task.missing([0, 1, 2]) == [0, 2]
    book.add("p0", 2, 22)
    assert book.add("p0", 0, 20) is True
    assert [g.in_order() for g in book.take(0, 3)] == [[20, 11, 22]]
