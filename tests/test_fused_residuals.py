"""The compiled step's residual adds in the output and down projections (harness.fused_residuals) against the stock
decoder layers."""
import types

import pytest
import torch

import harness.fused_projections as fp
from harness.fused_projections import PENDING_RESIDUAL, fused_gated_mlp_forward, fused_parameters, fused_projections
from harness.fused_residuals import fused_residuals, residual_layer, residual_layers


def test_stock_pre_norm_layers_are_recognised_and_others_are_not(tiny):
    """Qwen3's and Llama's decoder layers are the stock pre-norm layer; Gemma 3's (norms around each block) is not,
    and neither is a layer with a forward of its own instance."""
    for name in ("qwen3", "llama"):
        model = tiny(name)[0]
        assert residual_layers(model) == list(model.model.layers)
    assert residual_layers(tiny("gemma3")[0]) == []
    layer = tiny("qwen3")[0].model.layers[0]
    layer.forward = lambda *a, **k: None
    assert not residual_layer(layer)


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_fused_layers_give_the_stock_logits_with_both_adds_in_projections(name, tiny, monkeypatch):
    """Inside the blocks each layer's input reaches o_proj and the attention's sum the MLP's down projection as a
    residual (two per layer), and the logits are the stock ones (fp32 on the CPU: the same sums)."""
    model = tiny(name)[0]
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    expected = model(input_ids=ids).logits
    mlps = [layer.mlp for layer in model.model.layers]
    residuals, single_row = [], fp.single_row_linear
    monkeypatch.setattr(fp, "single_row_linear",
                        lambda x, w, b=None, r=None: residuals.append(r is not None) or single_row(x, w, b, r))
    for mlp in mlps:
        fused_parameters(mlp, fp.GATE_UP)
        mlp.forward = types.MethodType(fused_gated_mlp_forward, mlp)            # what compiled_parts compiles
    layers = residual_layers(model)                          # before the block, which gives o_proj a forward
    with fused_projections(model) as attentions:
        assert len(attentions) == len(layers) == model.config.num_hidden_layers
        with fused_residuals(layers, {id(m) for m in mlps}):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert residuals.count(True) == 2 * model.config.num_hidden_layers
    assert not any("forward" in vars(layer) for layer in model.model.layers)


def test_a_layer_whose_output_projection_ignores_the_residual_fails_and_leaves_none(tiny):
    """Outside fused_projections o_proj's stock forward never adds the residual: the fused layer says so, and no
    pending residual stays on o_proj for a later call."""
    model = tiny("qwen3")[0]
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    with fused_residuals(residual_layers(model), set()):
        with pytest.raises(RuntimeError, match="did not add its residual"):
            model(input_ids=ids)
    assert not any(PENDING_RESIDUAL in vars(m) for m in model.modules())
