"""The op adapters: each op's shape, sizes and kernel package, asked for by name or by shape."""

from __future__ import annotations

import dataclasses

import pytest

from replayssm_cli.model import ops
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

SHAPES = {"mamba2": Mamba2Shape(H=6, P=12, N=10, G=3), "gdn": GDNShape(H=2, HV=6, K=12, V=10)}


@pytest.mark.parametrize("name", list(ops.OPS))
def test_op_adapter_knows_its_shape(name):
    op, shape = ops.named(name), SHAPES[name]
    assert ops.of(shape) is op and op.name == shape.op == name
    assert op.dims == tuple(f.name for f in dataclasses.fields(shape) if f.name != "op")
    assert op.shape(**{k: getattr(shape, k) for k in op.dims}) == shape
    H, a, b = op.state_shape(shape)
    assert H == op.state_heads(shape) and H * a * b == shape.state_elems and a == op.head_width(shape)
    assert op.kernels().__name__ == f"replayssm_kernels.{name}"
    assert len(op.toml_keys) == len(op.dims) and op.tp_split(shape, 1) == ([], shape)


def test_op_adapter_sizes_by_hand():
    m, g = SHAPES["mamba2"], SHAPES["gdn"]
    assert ops.MAMBA2.input_elems(m) == 2 * 6 * 12 + 6 + 2 * 3 * 10
    assert ops.GDN_OP.input_elems(g) == 2 * 2 * 12 + 6 * 10 + 2 * 6
    assert ops.MAMBA2.mixer_sizes(m) == {"inner": 72, "conv_dim": 72 + 60, "in_proj": 144 + 60 + 6, "norm_group": 24}
    assert ops.GDN_OP.mixer_sizes(g) == {"inner": 60, "conv_dim": 48 + 60, "in_proj": 108 + 60 + 12, "norm_group": 10}
    assert ops.MAMBA2.tp_split(m, 3) == ([], Mamba2Shape(H=2, P=12, N=10, G=1))
    assert ops.MAMBA2.tp_split(m, 4) == (["H=6", "G=3"], None)
    assert ops.GDN_OP.tp_split(g, 2) == ([], GDNShape(H=1, HV=3, K=12, V=10))
    assert ops.MAMBA2.head_mismatch(m) is None and "not a multiple" in ops.GDN_OP.head_mismatch(GDNShape(H=4, HV=6, K=1, V=1))


def test_op_adapter_of_an_unknown_op_names_the_choices():
    with pytest.raises(ValueError, match="op must be one of mamba2, gdn"):
        ops.named("rwkv")
