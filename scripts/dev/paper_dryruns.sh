#!/usr/bin/env bash
# The paper experiments end to end on random weights with the paper models' shapes (issue #19's device dry runs):
# a few samples, short generation, every cell of each experiment's quantizer axis. On the GPU box, from the repo root:
#   STORE=results/dryrun bash scripts/dev/paper_dryruns.sh ruler aime_int2 ablation fidelity memory1 memory4
# Rows land in $STORE (default results/dryrun; cells already there are skipped), named <model>@random; with $OUT
# set (the device tool, which returns no deep folder) the store is also packed into $OUT/<store name>.tgz. Tables:
#   python scripts/make_tables.py --results results/dryrun --dry-runs
set -u
STORE=${STORE:-results/dryrun}
RANDOM_8B="model=qwen3_8b model.source=random +model.random_tokenizer=char device=cuda seed=0 results_dir=$STORE"
FIX=tests/fixtures
for part in "$@"; do
  case $part in
    ruler)      # RULER-NIAH 16k-128k x bf16 / quarot_int2 / oscar (one variant, one sample per cell)
      python run.py -m experiment=paper_ruler $RANDOM_8B 'task.variants=[niah_single_1]' task.samples=1 \
        task.max_new_tokens=16 ;;
    aime_int2)  # AIME25 at 32k x the five INT2-table quantizers (the paper_main cells already in the store skip)
      python run.py -m experiment=paper_aime_int2 $RANDOM_8B task.data_path=$FIX/aime_tiny.jsonl task.samples=2 \
        task.max_new_tokens=32 ;;
    ablation)   # the seven ablation quantizers x the five tasks, each task on its offline fixture
      for task in gpqa_diamond:gpqa humaneval:humaneval livecodebench:livecodebench aime25:aime math500:math500; do
        python run.py -m experiment=paper_ablation $RANDOM_8B task=${task%%:*} \
          task.data_path=$FIX/${task##*:}_tiny.jsonl task.samples=1 task.max_new_tokens=16
      done ;;
    fidelity)   # the per-layer error decomposition on Qwen3-4B-Thinking's shapes, every ablation quantizer
      python run.py -m experiment=paper_ablation task=fidelity model=qwen3_4b_thinking model.source=random \
        +model.random_tokenizer=char device=cuda seed=0 results_dir=$STORE ;;
    memory1)    # issue #20's memory row, Qwen3-8B shapes at 128k, batch 1: chunked prefill (the whole-prompt cells: ruler)
      python run.py -m $RANDOM_8B task=ruler_niah ctx=128k 'task.variants=[niah_single_1]' task.samples=1 \
        task.max_new_tokens=16 quantizer=bf16,oscar task.prefill_chunk=8192 ;;
    memory4)    # the same at batch 4, whole and chunked prefill (a cell that cannot fit ends as a status=oom row)
      python run.py -m $RANDOM_8B task=ruler_niah ctx=128k 'task.variants=[niah_single_1]' task.samples=4 \
        task.batch_size=4 task.max_new_tokens=16 quantizer=bf16,oscar task.prefill_chunk=null,8192 ;;
    *) echo "unknown part '$part' (ruler, aime_int2, ablation, fidelity, memory1, memory4)"; exit 2 ;;
  esac
done
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/$(basename "$STORE").tgz" -C "$(dirname "$STORE")" "$(basename "$STORE")"
fi
