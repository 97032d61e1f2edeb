"""The compiled step's fused q/k/v and gate/up projections (harness.fused_projections) against the separate ones."""
import torch

from harness.fused_projections import (FUSED, GATE_UP, PROJECTIONS, compiled_forward, fusable,
                                       fused_gated_mlp_forward, fused_parameters, fused_projections, gated_mlp)
from harness.quantizer import build_quantizer
from harness.seam import install


def _projections(attention, x):
    return [getattr(attention, name)(x) for name in PROJECTIONS]


def test_one_gemm_gives_the_three_projections_and_leaves_views(tiny, monkeypatch):
    """Inside the block q_proj's call computes k and v too (k_proj and v_proj then run no GEMM of their own); outside
    the stock forwards run, over weights that are views of the fused one."""
    model = tiny("qwen3")[0]
    attention = model.model.layers[0].self_attn
    x = torch.randn(2, 1, model.config.hidden_size)                           # [B, 1, hidden]
    expected, expected_other = _projections(attention, x), attention.k_proj(x + 1)
    gemms, linear = [], torch.nn.functional.linear
    with fused_projections(model) as modules:
        monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: gemms.append(a[1].shape) or linear(*a))
        fused = _projections(attention, x)
        other = attention.k_proj(x + 1)                                        # another input: its own GEMM
        monkeypatch.undo()
    assert len(modules) == model.config.num_hidden_layers
    rows = sum(getattr(attention, name).out_features for name in PROJECTIONS)
    assert gemms == [(rows, x.shape[-1]), tuple(attention.k_proj.weight.shape)]
    for a, b in zip(fused + [other], expected + [expected_other]):
        torch.testing.assert_close(a, b)
    assert not any("forward" in vars(getattr(attention, name)) for name in PROJECTIONS)
    weight, _ = getattr(attention, FUSED[PROJECTIONS])
    assert attention.v_proj.weight.data_ptr() == weight[-attention.v_proj.out_features:].data_ptr()
    for a, b in zip(_projections(attention, x), expected):
        torch.testing.assert_close(a, b)


def test_in_place_updates_reach_the_fused_weight_and_replacements_rebuild_it(tiny):
    """The seam folds R_V into v_proj in place (and restores it): the fused GEMM follows; a replaced parameter
    makes the next entry fuse again."""
    model = tiny("qwen3")[0]
    attention = model.model.layers[1].self_attn
    with fused_projections(model):
        pass
    x = torch.randn(1, 1, model.config.hidden_size)
    with install(model, build_quantizer("quarot_int2")):                   # folds a Hadamard into v_proj in place
        expected = _projections(attention, x)
        with fused_projections(model):
            torch.testing.assert_close(_projections(attention, x)[2], expected[2])
    first = getattr(attention, FUSED[PROJECTIONS])[0]
    attention.k_proj.weight.data = attention.k_proj.weight.data.clone() * 2
    expected = _projections(attention, x)
    with fused_projections(model):
        torch.testing.assert_close(_projections(attention, x)[1], expected[1])
    assert getattr(attention, FUSED[PROJECTIONS])[0].data_ptr() != first.data_ptr()
    assert fused_parameters(attention)[0].data_ptr() == getattr(attention, FUSED[PROJECTIONS])[0].data_ptr()


def test_only_plain_linear_projections_of_one_kind_are_fused(tiny):
    model = tiny("qwen3")[0]
    attention = model.model.layers[0].self_attn
    assert fusable(attention)
    attention.k_proj.forward = lambda x: x                                   # e.g. an offloading hook's wrapper
    assert not fusable(attention)
    del attention.k_proj.forward
    attention.v_proj.to(torch.float64)
    assert not fusable(attention)
    assert not fusable(model.model.layers[0].mlp)


def test_gated_mlps_compute_gate_and_up_as_one_gemm(tiny, monkeypatch):
    """Every gated MLP of Qwen3, Llama and Gemma 3 is recognised; its fused forward runs one GEMM for gate and up
    (then down_proj's) and gives the stock output; the projections' weights become views of the fused one."""
    for name in ("qwen3", "llama", "gemma3"):
        model = tiny(name)[0]
        mlp = model.model.layers[0].mlp
        assert gated_mlp(mlp) and compiled_forward(mlp) is fused_gated_mlp_forward
        x = torch.randn(2, 3, model.config.hidden_size)                        # [B, T, hidden]
        expected = mlp(x)
        gemms, linear = [], torch.nn.functional.linear
        monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: gemms.append(a[1].shape) or linear(*a))
        got = fused_gated_mlp_forward(mlp, x)
        monkeypatch.undo()
        torch.testing.assert_close(got, expected)
        rows = mlp.gate_proj.out_features + mlp.up_proj.out_features
        assert gemms == [(rows, x.shape[-1]), tuple(mlp.down_proj.weight.shape)]
        weight, _ = getattr(mlp, FUSED[GATE_UP])
        assert mlp.up_proj.weight.data_ptr() == weight[mlp.gate_proj.out_features:].data_ptr()


def test_other_mlps_keep_their_class_forward(tiny):
    """A different forward (a subclass's, or one of the instance) or an unfusable projection is compiled as it is."""
    model = tiny("qwen3")[0]
    mlp = model.model.layers[0].mlp

    class Scaled(type(mlp)):
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * 2

    mlp.__class__ = Scaled
    assert not gated_mlp(mlp) and compiled_forward(mlp) is Scaled.forward
    mlp.__class__ = Scaled.__mro__[1]
    assert gated_mlp(mlp)
    mlp.up_proj.to(torch.float64)
    assert not gated_mlp(mlp)
    assert compiled_forward(model.model.norm) is type(model.model.norm).forward


def test_output_projections_and_lm_head_take_single_rows_inside_the_block_only(tiny):
    """o_proj and the LM head run `single_row_linear` inside the block (F.linear off CUDA, the same result) and their
    class forward again after it."""
    model = tiny("qwen3")[0]
    attention = model.model.layers[0].self_attn
    head = model.get_output_embeddings()
    x = torch.randn(1, 1, attention.o_proj.in_features)
    expected = attention.o_proj(x)
    with fused_projections(model):
        assert "forward" in vars(attention.o_proj) and "forward" in vars(head)
        torch.testing.assert_close(attention.o_proj(x), expected)
    assert "forward" not in vars(attention.o_proj) and "forward" not in vars(head)
