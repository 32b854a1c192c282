"""Windowed DINOv2 against a naive twin that slices windows and attends with explicit loops."""

import math

import pytest
import torch
import torch.nn.functional as F

from detrkit.models.vit import WindowedDinov2, init_vit_weights


def naive_attention(block, x):
    """x (T, C) one sequence -> attention output (T, C), head by head."""
    proj, heads = block.attention.attention, block.attention.heads
    q, k, v = proj.query(x), proj.key(x), proj.value(x)
    dim = x.shape[-1] // heads
    outs = []
    for h in range(heads):
        sl = slice(h * dim, (h + 1) * dim)
        weights = (q[:, sl] @ k[:, sl].T / math.sqrt(dim)).softmax(-1)
        outs.append(weights @ v[:, sl])
    dense = block.attention.output.dense
    return F.linear(torch.cat(outs, -1), dense.weight, dense.bias)


def naive_mlp(block, x):
    fc1, fc2 = block.mlp.fc1, block.mlp.fc2
    return F.linear(F.gelu(F.linear(x, fc1.weight, fc1.bias)), fc2.weight, fc2.bias)


def naive_vit(vit, pixels, windows):
    """One image at a time: list of windows, each [CLS + its tokens]; global blocks join them."""
    emb = vit.embeddings
    patches = emb.patch_embeddings(pixels[None])[0]  # (C, rows, cols)
    channels, rows, cols = patches.shape
    pos = emb.patch_position_embeddings(rows, cols).reshape(rows, cols, channels)
    grid = patches.permute(1, 2, 0) + pos
    cls = emb.cls_token[0, 0] + emb.position_embeddings[0, 0]
    wr, wc = rows // windows, cols // windows
    seqs = [torch.cat([cls[None], grid[i * wr:(i + 1) * wr, j * wc:(j + 1) * wc].reshape(-1, channels)])
            for i in range(windows) for j in range(windows)]
    maps = []
    for index, block in enumerate(vit.encoder.layer):
        normed = [block.norm1(s) for s in seqs]
        if block.windowed:
            attn = [naive_attention(block, s) for s in normed]
        else:
            joined = naive_attention(block, torch.cat(normed))
            attn = list(joined.split([len(s) for s in seqs]))
        seqs = [s + block.layer_scale1.lambda1 * a for s, a in zip(seqs, attn)]
        seqs = [s + block.layer_scale2.lambda1 * naive_mlp(block, block.norm2(s)) for s in seqs]
        if index in vit.taps:
            full = torch.zeros(rows, cols, channels)
            for n, s in enumerate(seqs):
                i, j = divmod(n, windows)
                full[i * wr:(i + 1) * wr, j * wc:(j + 1) * wc] = vit.layernorm(s)[1:].reshape(wr, wc, channels)
            maps.append(full.permute(2, 0, 1))
    return maps


def tiny_vit(windows=2, grid=4):
    torch.manual_seed(0)
    vit = WindowedDinov2(in_channels=3, width=24, heads=2, patch_size=4, grid=grid, num_windows=windows,
                         out_feature_indexes=[1, 3, 4])
    init_vit_weights(vit)
    with torch.no_grad():
        for p in vit.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return vit.eval()


def test_global_blocks_are_the_tapped_block_numbers():
    vit = tiny_vit()
    assert [b.windowed for b in vit.encoder.layer] == [True, False, True, False]
    assert vit.taps == [0, 2, 3]


@pytest.mark.parametrize("size", [(16, 16), (24, 16)])
def test_matches_naive_windowing_and_attention(size):
    vit = tiny_vit()
    pixels = torch.randn(2, 3, *size)
    with torch.no_grad():
        fast = vit(pixels)
        for b in range(2):
            for got, want in zip(fast, naive_vit(vit, pixels[b], 2)):
                torch.testing.assert_close(got[b], want, atol=1e-5, rtol=1e-4)
    assert fast[0].shape == (2, 24, size[0] // 4, size[1] // 4)


def test_single_window_makes_every_block_global():
    vit = tiny_vit(windows=1)
    assert not any(b.windowed for b in vit.encoder.layer)
    pixels = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        for got, want in zip(vit(pixels), naive_vit(vit, pixels[0], 1)):
            torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-4)


def test_position_table_resized_bicubically_for_another_grid():
    vit = tiny_vit(grid=4)
    table = vit.embeddings.position_embeddings[0, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    want = F.interpolate(table, size=(6, 4), mode="bicubic", align_corners=False, antialias=True)
    with torch.no_grad():
        got = vit.embeddings.patch_position_embeddings(6, 4)
        again = vit.embeddings.patch_position_embeddings(6, 4)
    torch.testing.assert_close(got, want[0].permute(1, 2, 0).reshape(24, -1))
    assert again is got  # cached per grid in inference
    assert vit.embeddings.patch_position_embeddings(4, 4).data_ptr() == vit.embeddings.position_embeddings[0, 1:].data_ptr()


def test_input_not_divisible_into_windows_is_rejected():
    vit = tiny_vit()
    with pytest.raises(ValueError, match="windows"):
        vit(torch.randn(1, 3, 12, 16))


def test_gradient_checkpointing_gives_same_gradients():
    vit = tiny_vit().train()
    pixels = torch.randn(1, 3, 16, 16)
    sum(f.sum() for f in vit(pixels)).backward()
    plain = {n: p.grad.clone() for n, p in vit.named_parameters() if p.grad is not None}
    assert len(plain) == len(list(vit.parameters())) - 1  # all but the unused mask token
    vit.zero_grad(set_to_none=True)
    vit.gradient_checkpointing = True
    sum(f.sum() for f in vit(pixels)).backward()
    for name, p in vit.named_parameters():
        if name in plain:
            torch.testing.assert_close(plain[name], p.grad)
