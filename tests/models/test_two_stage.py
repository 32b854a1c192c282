"""Memory flattening and grid proposals: valid extents, padding and the edge rule."""

import torch

from detrkit.models.two_stage import flatten_levels, grid_proposals


def test_unpadded_level_has_unit_ratios_and_cell_centred_proposals():
    memory = flatten_levels([torch.randn(1, 8, 2, 3)], None)
    assert memory.tokens.shape == (1, 6, 8)
    torch.testing.assert_close(memory.valid_ratios, torch.ones(1, 1, 2))
    proposals, valid = grid_proposals(memory)
    assert valid.all()
    expected_x = torch.tensor([1, 3, 5, 1, 3, 5]) / 6
    expected_y = torch.tensor([1, 1, 1, 3, 3, 3]) / 4
    torch.testing.assert_close(proposals[0, :, 0], expected_x)
    torch.testing.assert_close(proposals[0, :, 1], expected_y)
    torch.testing.assert_close(proposals[0, :, 2:], torch.full((6, 2), 0.05))


def test_padding_shrinks_extent_and_zeroes_padded_proposals():
    mask = torch.zeros(2, 2, 4, dtype=torch.bool)
    mask[1, :, 2:] = True  # image 1 is 2 columns wide
    memory = flatten_levels([torch.randn(2, 8, 2, 4)], [mask])
    torch.testing.assert_close(memory.valid_ratios[1, 0], torch.tensor([0.5, 1.0]))
    proposals, valid = grid_proposals(memory)
    assert valid[0].all()
    assert valid[1].tolist() == [True, True, False, False] * 2
    assert (proposals[1][~valid[1]] == 0).all()
    # centres normalised by the valid width: columns 0, 1 of 2 -> 0.25, 0.75
    torch.testing.assert_close(proposals[1, :2, 0], torch.tensor([0.25, 0.75]))


def test_outermost_cells_of_wide_maps_are_invalid():
    memory = flatten_levels([torch.randn(1, 4, 1, 60)], None)
    _, valid = grid_proposals(memory)
    # centre of column 0 is 0.5/60 < 0.01 and of column 59 is > 0.99
    assert not valid[0, 0] and not valid[0, 59] and valid[0, 1:59].all()
