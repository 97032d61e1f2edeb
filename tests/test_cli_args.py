"""harness/cli_args.py: command-line checks that answer in one sentence before anything is built."""
import argparse
from pathlib import Path

import pytest

from harness.cli_args import (bad_group_choice, bad_override, batch_ctx_points, kernel_head_dims, positive_int,
                              positive_ints)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_every_choice_of_a_group_and_of_a_sweep_list_needs_its_config_file():
    assert bad_group_choice(["quantizer=oscar", "ctx=4k", "quantizer=ablation/oscar_h", "seed=0,1"], CONFIGS) is None
    assert bad_group_choice(["-m", "quantizer=bf16,oscar", "experiment=null", "+model.x=1"], CONFIGS) is None
    assert bad_group_choice(["quantizer=glob(*)", "ctx=choice(4k,8k)"], CONFIGS) is None      # sweep functions
    problem = bad_group_choice(["ctx=4k", "quantizer=bf16,zzz"], CONFIGS)
    assert problem.startswith("quantizer=zzz names no config in configs/quantizer/; known: bf16, hf_quantized_cache,")
    assert bad_group_choice(["experiment=nope"], CONFIGS).startswith("experiment=nope names no config")


def test_an_override_of_a_key_the_config_lacks_is_one_sentence():
    problem = bad_override(["quantizer=oscar", "quantizer.nope.deep=2"], CONFIGS)
    assert problem == ("quantizer.nope.deep is not a key of the composed config (a typo, or an option it lacks); "
                       "to add it: +quantizer.nope.deep=2.")
    assert bad_override(["quantizer=oscar", "quantizer.sink=4", "+task.nope=1", "hydra.run.dir=/tmp/x"], CONFIGS) is None



def test_a_sweep_checks_its_overrides_under_each_group_choice():
    problem = bad_override(["-m", "quantizer=oscar,bf16", "ctx=4k,8k", "quantizer.page=16"], CONFIGS)
    assert problem == ("quantizer.page is not a key of the composed config (a typo, or an option it lacks); "
                       "to add it: +quantizer.page=16.")                       # oscar has a page, bf16 has none
    assert bad_override(["--multirun", "task.nope=1,2"], CONFIGS).startswith("task.nope is not a key")
    assert bad_override(["-m", "quantizer=oscar,naive_int2", "quantizer.page=16", "seed=0,1"], CONFIGS) is None
    assert bad_override(["-m", "quantizer=bf16,oscar", "+quantizer.nope=1"], CONFIGS) is None
    assert bad_override(["-m", "quantizer=glob(*)", "task.nope=1"], CONFIGS) is None     # glob(): left to Hydra


def test_integer_list_types_refuse_text_zero_and_lists_where_one_is_asked():
    assert positive_ints("1,8") == [1, 8] and positive_int("16") == 16 and kernel_head_dims("64,256") == [64, 256]
    for parse, text, needle in ((positive_ints, "4k", "not a comma-separated list of integers"),
                                (positive_ints, "1,0", "every value must be at least 1"),
                                (positive_int, "8,16", "is not one integer"),
                                (kernel_head_dims, "128,96", "the kernels take head_dim 64, 128, 256")):
        with pytest.raises(argparse.ArgumentTypeError, match=needle):
            parse(text)


def test_batch_ctx_points_take_positive_pairs_only():
    assert batch_ctx_points("1:32768,8:1024") == [(1, 32768), (8, 1024)]
    for text, needle in (("8x1024", "each point is batch:ctx"), ("0:1024", "must be at least 1"),
                         ("1:4k", "is not one integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=needle):
            batch_ctx_points(text)
