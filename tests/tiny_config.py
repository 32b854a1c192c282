"""ModelConfig fields of a tiny detector (64 px input, 4x4 patch grid, 2x2 windows): builds and runs
in well under a second on CPU. Imported by conftest.py and by scripts the tests launch."""

TINY = dict(
    pretrain_weights=None, device="cpu", encoder_layers=4, encoder_width=48, encoder_heads=2,
    out_feature_indexes=[2, 4], hidden_dim=32, sa_nheads=2, ca_nheads=4, dim_feedforward=64,
    dec_layers=2, num_queries=12, num_select=12, group_detr=3, resolution=64,
    positional_encoding_size=4, num_classes=5,
)
