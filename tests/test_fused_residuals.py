"""The compiled step's residual adds in the output and down projections (harness.fused_residuals) against the stock
decoder layers."""
import types

import pytest
import torch

import harness.fused_projections as fp
import harness.fused_residuals as fr
from harness.fused_projections import (PENDING_NORM, PENDING_RESIDUAL, fused_gated_mlp_forward, fused_parameters,
                                       fused_projections)
from harness.fused_residuals import fused_residuals, norm_folding_layer, residual_layer, residual_layers


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
                        lambda x, w, b=None, r=None, norm=None: residuals.append(r is not None)
                        or single_row(x, w, b, r, norm))
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


def test_stock_layers_fold_their_norms_and_others_do_not(tiny):
    """Qwen3's and Llama's layers (stock RMSNorms, an attention using its input only in q/k/v, fusable q/k/v, a gated
    MLP) fold their norms; Gemma 3's (not a residual layer) and a layer whose norm has its own forward do not."""
    for name in ("qwen3", "llama"):
        assert all(norm_folding_layer(layer) for layer in tiny(name)[0].model.layers)
    assert not any(norm_folding_layer(layer) for layer in tiny("gemma3")[0].model.layers)
    layer = tiny("qwen3")[0].model.layers[0]
    layer.post_attention_layernorm.forward = lambda x: x
    assert not norm_folding_layer(layer)


def test_the_gated_gemv_takes_silu_activations_only(tiny):
    """Qwen3's and Llama's MLP activations are SiLU (the gate/up GEMV applies them); Gemma 3's GELU is not."""
    assert all(fp.silu(tiny(name)[0].model.layers[0].mlp.act_fn) for name in ("qwen3", "llama"))
    assert fp.silu(torch.nn.SiLU())
    assert not fp.silu(tiny("gemma3")[0].model.layers[0].mlp.act_fn)


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_folded_norms_give_the_stock_logits_and_no_layer_norm_runs(name, tiny, monkeypatch):
    """With the norms folded (forced for a single row on the CPU, where the projections norm their input with
    `kernels.gemv.rms_norm` before F.linear; on CUDA the GEMV kernel does it), a one-token step's logits are the stock
    ones (fp32), every layer hands its q/k/v and gate/up GEMMs a norm, and none of the layers' RMSNorm modules runs."""
    model = tiny(name)[0]
    ids = torch.randint(0, model.config.vocab_size, (1, 1))
    expected = model(input_ids=ids).logits
    layers = residual_layers(model)
    folding = {id(layer) for layer in layers if norm_folding_layer(layer)}    # before any forward is swapped
    norms, ran, single_row = [], [], fp.single_row_linear
    monkeypatch.setattr(fp, "single_row_linear", lambda x, w, b=None, r=None, norm=None: norms.append(norm is not None)
                        or single_row(x, w, b, r, norm))
    monkeypatch.setattr(fr, "single_gemv_row", lambda x: x.numel() == x.shape[-1])
    for layer in layers:
        fused_parameters(layer.mlp, fp.GATE_UP)
        layer.mlp.forward = types.MethodType(fused_gated_mlp_forward, layer.mlp)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.register_forward_hook(lambda *args: ran.append(1))
    with fused_projections(model):
        with fused_residuals(layers, {id(layer.mlp) for layer in layers}, folding):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert len(folding) == model.config.num_hidden_layers and norms.count(True) == 2 * len(folding)
    assert not ran and not any(PENDING_NORM in vars(m) for m in model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GEMV kernel folds norms on CUDA single rows")
def test_bf16_gemvs_with_folded_norms_give_the_unfolded_logits_on_cuda(tiny, monkeypatch):
    """Qwen3 in bf16 on CUDA, one token: the folded norms (inside the q/k/v and gate/up GEMV kernels) give the logits
    of the same fused layers with the norm modules run, within bf16 rounding of the normed rows; both runs' gate/up
    GEMVs apply the SiLU product (gated)."""
    model = tiny("qwen3")[0].to("cuda", torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (1, 1), device="cuda")
    layers = residual_layers(model)
    folding = {id(layer) for layer in layers if norm_folding_layer(layer)}
    for layer in layers:
        layer.mlp.forward = types.MethodType(fp.compiled_forward(layer.mlp), layer.mlp)   # as compiled_parts does
    logits, calls, gemv_op = [], [], fp.gemv_op
    monkeypatch.setattr(fp, "gemv_op", lambda *args: calls.append((args[4] is not None, args[6:] == (True,)))
                        or gemv_op(*args))
    for fold in (set(), folding):
        with fused_projections(model), fused_residuals(layers, {id(layer.mlp) for layer in layers}, fold):
            logits.append(model(input_ids=ids).logits.float())
    layers_n = model.config.num_hidden_layers
    assert len(folding) == layers_n
    torch.testing.assert_close(logits[1], logits[0], rtol=2e-2, atol=2e-2)
    assert calls.count((True, False)) == calls.count((True, True)) == layers_n      # q/k/v and gate/up, normed
    assert calls.count((False, True)) == layers_n                                    # gate/up unfolded, still gated
