"""Which rows of a rollout go together in the update: micro-batches of whole groups or of pieces
of one group, longest first; how a micro-batch shares its prompt forward; results scattered
back to rollout order. Hand-computed layouts."""

import torch

from groupwise.policy.batches import micro_batch_rows, prompt_blocks, scatter_rows


def test_micro_batch_rows_sorts_whole_groups_longest_first():
    # 3 groups of 2: group lengths (max) 3, 5, 4 -> order 1, 2, 0; micro-batches of 4 rows.
    lengths = torch.tensor([3, 1, 2, 5, 4, 4])
    batches = micro_batch_rows(lengths, 4, group_size=2)
    assert [b.tolist() for b in batches] == [[2, 3, 4, 5], [0, 1]]
    # Rows one by one when the micro-batch does not hold whole groups (stable for ties).
    batches = micro_batch_rows(lengths, 3, group_size=2)
    assert [b.tolist() for b in batches] == [[3, 4, 5], [0, 2, 1]]
    # No grouping without uniform groups; rollout order when sorting is off or one batch fits.
    assert [b.tolist() for b in micro_batch_rows(lengths, 4, None)] == [[3, 4, 5, 0], [2, 1]]
    unsorted = micro_batch_rows(lengths, 4, group_size=2, by_length=False)
    assert [b.tolist() for b in unsorted] == [[0, 1, 2, 3], [4, 5]]
    assert [b.tolist() for b in micro_batch_rows(lengths, 6, 2)] == [[0, 1, 2, 3, 4, 5]]


def test_micro_batch_rows_splits_groups_into_pieces_longest_rows_together():
    # Groups of 4, micro-batches of 2: each group's rows sorted longest first and cut in two
    # (group 0: rows 3, 0 | 2, 1; group 1: rows 7, 4 | 5, 6), pieces ordered by longest row.
    lengths = torch.tensor([3, 1, 2, 5, 4, 4, 0, 6])
    batches = micro_batch_rows(lengths, 2, group_size=4)
    assert [b.tolist() for b in batches] == [[7, 4], [3, 0], [5, 6], [2, 1]]
    unsorted = micro_batch_rows(lengths, 2, group_size=4, by_length=False)
    assert [b.tolist() for b in unsorted] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_prompt_blocks_and_scatter_rows():
    prompts, counts = prompt_blocks(torch.tensor([2, 2, 0, 0]))  # two whole groups
    assert prompts.tolist() == [2, 0] and counts == [2, 2]
    prompts, counts = prompt_blocks(torch.tensor([1, 1, 1]))  # part of one group
    assert prompts.tolist() == [1] and counts == [3]
    prompts, counts = prompt_blocks(torch.tensor([3, 3, 3, 0, 5, 5]))  # unequal runs
    assert prompts.tolist() == [3, 0, 5] and counts == [3, 1, 2]
    assert prompt_blocks(torch.tensor([0, 1])) is None  # no prompt has two rows
    assert prompt_blocks(torch.tensor([0, 0, 1, 0])) is None  # prompt 0's rows are apart
    parts = [torch.tensor([[30.0], [40.0]]), torch.tensor([[10.0], [20.0]])]
    batches = [torch.tensor([2, 3]), torch.tensor([0, 1])]
    assert scatter_rows(parts, batches).flatten().tolist() == [10.0, 20.0, 30.0, 40.0]


def test_micro_batch_rows_lays_unequal_groups_out_group_after_group():
    # Groups of 3, 1 and 4 rows (a curriculum's counts); group maxima 5, 2, 6 -> order 2, 0, 1;
    # within a group longest first; cut every 3 rows: each micro-batch holds whole groups or
    # contiguous pieces of at most two, so each encodes a prompt once per piece.
    lengths = torch.tensor([3, 5, 1, 2, 6, 0, 4, 4])
    group_ids = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2])
    batches = micro_batch_rows(lengths, 3, None, group_ids=group_ids)
    assert [b.tolist() for b in batches] == [[4, 6, 7], [5, 1, 0], [2, 3]]
    blocks = [prompt_blocks(group_ids[b]) for b in batches]
    assert [b[1] if b else None for b in blocks] == [[3], [1, 2], None]  # None: nothing shared
    unsorted = micro_batch_rows(lengths, 3, None, by_length=False, group_ids=group_ids)
    assert [b.tolist() for b in unsorted] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # Uniform groups that neither fit nor split evenly take the same layout.
    uniform = torch.tensor([0, 0, 1, 1, 2, 2])
    batches = micro_batch_rows(torch.tensor([3, 1, 2, 5, 4, 4]), 4, 2, group_ids=uniform)
    assert [b.tolist() for b in batches] == [[2, 3, 4, 5], [0, 1]]
    batches = micro_batch_rows(torch.tensor([3, 1, 2, 5, 4, 4]), 3, 2, group_ids=uniform)
    assert [b.tolist() for b in batches] == [[3, 2, 4], [5, 0, 1]]
