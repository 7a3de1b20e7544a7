#!/usr/bin/env bash
# Run named steps on the GPU machine, each under its own time limit, logs and results under $OUT.
# Usage: benchmarks/gpu_run.sh STEP[:SECONDS] ...   (steps: see the case below)
# At the end it packs everything under $OUT into $OUT/results.tgz and deletes the rest: a device
# call must end with it (a `tar ... results.tgz` run after it overwrites the results).
set -u
OUT=${OUT:-./out}
mkdir -p "$OUT/logs"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the profile the calib-* steps measure against and update in place (later steps then use it):
# the shipped H200 profile unless CALIB_PROFILE names another GPU's (calibrate_memory_efficiency.py
# refuses a profile of another chip than the one present)
export CALIB_PROFILE=${CALIB_PROFILE:-src/gpushape/hardware/profiles/h200-sxm.json}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
run() {  # run NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${secs}s)"
  timeout "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0))s"
  tail -n "${TAIL:-25}" "$OUT/logs/$name.log"
}
for spec in "$@"; do
  name=${spec%%:*}; secs=${spec#*:}; [ "$secs" = "$spec" ] && secs=300
  case $name in
    info) run info "$secs" bash -c 'nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; python3 -m gpushape gpus' ;;
    # every fused kernel's forward and backward under compute-sanitizer: memcheck (out of bounds,
    # misaligned), then racecheck (shared-memory hazards); PyTorch's caching allocator off
    sanitize) run sanitize "$secs" bash -c 'cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); for tool in memcheck racecheck; do echo "== $tool"; PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$cs" --tool "$tool" --error-exitcode 9 --print-limit 30 python3 benchmarks/kernels/sanitize_kernels.py --out "$OUT/sanitize_$tool.json"; echo "$tool rc=$?"; done' ;;
    gputests) run gputests "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -x -n 4 tests/kernel_ops ;;
    gputests-attn) run gputests-attn "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernel_ops/test_softmax_dropout_gpu.py tests/kernel_ops/test_fused_qkv.py tests/kernel_ops/test_kv_cache.py tests/bench tests/probe tests/cli tests/hardware ;;
    gputests-k) run gputests-k "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -n 3 -k "not 2_31 and not 2_pow_31" tests ;;
    gputests-big) run gputests-big "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -k "2_31 or 2_pow_31" tests ;;
    norms) run norms "$secs" python3 benchmarks/kernels/bench_norms.py ;;
    bn) run bn "$secs" bash -c 't=""; [ -f "$OUT/tune_batch_norm_act.json" ] && t="--tuning $OUT/tune_batch_norm_act.json"; python3 benchmarks/kernels/bench_batch_norm_act.py $t' ;;
    # dropout + add + LayerNorm: the fused kernel's tests on the GPU, then it against eager and Inductor
    dal) run dal "$secs" bash -c 'python3 -m pytest -q -p no:cacheprovider tests/kernel_ops/test_dropout_add_layer_norm.py tests/transforms/test_fuse_dropout_add_norm.py && python3 benchmarks/kernels/bench_dropout_add_norm.py --out "$OUT" ${DAL_ARGS:-}' ;;
    # cuDNN's graph API: BatchNorm's statistics (and its scale-bias-ReLU) fused into ResNet-50's convolutions? (needs .whl/nvidia_cudnn_frontend)
    cudnn-fusion) run cudnn-fusion "$secs" python3 benchmarks/kernels/probe_cudnn_fusion.py --out "$OUT/probe_cudnn_fusion.json" ;;
    attn) run attn "$secs" python3 benchmarks/kernels/bench_attention.py ;;
    attn-qkv) run attn-qkv "$secs" python3 benchmarks/kernels/bench_attention.py --sections qkv ;;
    diag-bn) run diag-bn "$secs" python3 benchmarks/kernels/diagnose_batch_norm_act.py --repeats "${REPEATS:-6}" --out "$OUT/diagnose_batch_norm_act.json" ;;
    prof-bn) run prof-bn "$secs" python3 benchmarks/kernels/profile_batch_norm_act.py --host --out "$OUT/profile_batch_norm_act.json" ;;
    qkv-gemms) run qkv-gemms "$secs" python3 benchmarks/kernels/probe_qkv_gemms.py --out "$OUT/probe_qkv_gemms.json" ;;
    qkv-grads) run qkv-grads "$secs" python3 benchmarks/kernels/probe_qkv_grads.py --out "$OUT/probe_qkv_grads.json" ;;
    host) run host "$secs" python3 benchmarks/kernels/host_costs.py --out "$OUT/host_costs.json" ;;
    prof-norms) run prof-norms "$secs" python3 benchmarks/kernels/profile_norms_host.py ;;
    gputests-all) run gputests-all "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --durations=15 -k "not 2_pow_31" tests ;;
    data) run data "$secs" python3 benchmarks/data/bench_input_pipeline.py --out "$OUT/input_pipeline.json" ;;
    optimize) run optimize "$secs" python3 benchmarks/transforms/bench_optimize.py --out "$OUT/bench_optimize.json" ;;
    gputests-misc) run gputests-misc "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider tests/bench tests/probe tests/hardware tests/tracing tests/auditing tests/cli ;;
    normgate) run normgate "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -k "gpu_gate or tanh_gate" tests/kernel_ops/test_add_layer_norm.py tests/kernel_ops/test_layer_norm_gelu.py tests/kernel_ops/test_rms_norm.py ;;
    correlate) run correlate "$secs" python3 benchmarks/trace/correlate.py --models resnet50,bert-base,bert-base-manual ;;
    correlate-bert) run correlate-bert "$secs" python3 benchmarks/trace/correlate.py --models bert-base,bert-base-manual ;;
    correlate-nchw) run correlate-nchw "$secs" python3 benchmarks/trace/correlate.py --models resnet50,resnet50-nchw --stem correlate-nchw ;;
    correlate-flat) run correlate-flat "$secs" python3 benchmarks/trace/correlate.py --flat-memory ;;
    # eager kernels' memory efficiency added to the shipped profile, which later steps then use
    calib-mem) run calib-mem "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # fused attention's rates added to the shipped profile, which later steps then use
    calib-bn-family) run calib-bn-family "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families fused_batch_norm_act --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    calib-nchw) run calib-nchw "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families "${FAMILIES:-batch_norm_nchw,pool_nchw,nchw_conversion}" --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    calib-attn) run calib-attn "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts attention --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # the kernel floor (the shortest a kernel runs: probe/memory.py) into CALIB_PROFILE
    kernel-floor) run kernel-floor "$secs" bash -c 'python3 benchmarks/hardware/measure_kernel_floor.py --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # graph-layers' replay rates (graph_layer, graph_layer_param) into CALIB_PROFILE's host rates alone
    graph-rates) run graph-rates "$secs" bash -c 'python3 benchmarks/hardware/graph_layer_rates.py --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    tune-norms) run tune-norms "$secs" python3 benchmarks/kernels/tune_norms.py ;;
    gputests-bn) run gputests-bn "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 -k "not 2_pow_31" tests/kernel_ops/test_batch_norm_act_gpu.py ;;
    tune-bn) run tune-bn "$secs" python3 benchmarks/kernels/tune_batch_norm_act.py --quick ${TUNE_ARGS:-} ;;
    # ResNet-50's eleven channels_last BatchNorm shapes at batch 256 but the stem's: the four block
    # outputs with the gradient handed over, the rest plain; tables under $OUT/tune-{ho,plain}
    # and /tmp/keep (for GPUSHAPE_BATCH_NORM_TUNING in a later call on the same machine)
    tune-bn-resnet) run tune-bn-resnet "$secs" bash -c 'mkdir -p /tmp/keep; OUT="$OUT/tune-ho" python3 benchmarks/kernels/tune_batch_norm_act.py --quick --handover --budget-s "${HO_BUDGET:-100}" --shapes 256x256x56x56,256x512x28x28,256x1024x14x14,256x2048x7x7 && cp "$OUT/tune-ho/tune_batch_norm_act.json" /tmp/keep/ho.json; OUT="$OUT/tune-plain" python3 benchmarks/kernels/tune_batch_norm_act.py --quick --budget-s "${PLAIN_BUDGET:-200}" --shapes 256x64x56x56,256x128x56x56,256x128x28x28,256x256x28x28,256x256x14x14,256x512x14x14,256x512x7x7 && cp "$OUT/tune-plain/tune_batch_norm_act.json" /tmp/keep/plain.json' ;;
    probe-quick) run probe-quick "$secs" python3 -m gpushape probe --quick -o "$OUT/probe-h200-quick/h200-sxm.json" ;;
    probe) run probe "$secs" python3 -m gpushape probe -o "$OUT/probe-h200/h200-sxm.json" ;;
    diag-nchw) run diag-nchw "$secs" python3 benchmarks/audit/diagnose_nchw.py --out "$OUT/diagnose_nchw.json" ;;
    audit-validate) run audit-validate "$secs" python3 benchmarks/audit/validate_savings.py ;;
    # make test on a clean export of HEAD (uncommitted work in the tree does not count)
    # (.carry/head.tar: `git archive -o .carry/head.tar HEAD`, carried to the machine)
    maketest) run maketest "$secs" bash -c 'rm -rf /tmp/clean && mkdir -p /tmp/clean && tar -xf .carry/head.tar -C /tmp/clean && cd /tmp/clean && make test PYTEST_WORKERS=8' ;;
    # gpushape bench: variants side by side and the fix-by-fix loop (results under $OUT/bench-h200)
    gputests-steps) run gputests-steps "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider tests/transforms tests/steps ;;
    bench-resnet) run bench-resnet "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench torchvision.models:resnet50 --input 256x3x224x224 --vs "${VS:-channels-last,optimize,optimize+graph,channels-last+compile}" --csv "$OUT/bench-h200/bench.csv" --plot "$OUT/bench-h200/resnet50.png" -o "$OUT/bench-h200/resnet50.json"' ;;
    loop-resnet) run loop-resnet "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench torchvision.models:resnet50 --input 256x3x224x224 --optimize --csv "$OUT/bench-h200/loop.csv" --plot "$OUT/bench-h200/loop-resnet50.png" -o "$OUT/bench-h200/loop-resnet50.json"' ;;
    # the loop in a mode (MODE, default graph), on a profile (PROFILE: a file; default the shipped one)
    loop-resnet-mode) run loop-resnet-mode "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && p=""; [ -n "${PROFILE:-}" ] && p="--profile $PROFILE"; python3 -m gpushape bench torchvision.models:resnet50 --input 256x3x224x224 --optimize --mode "${MODE:-graph}" $p --rounds "${ROUNDS:-5}" --csv "$OUT/bench-h200/loop.csv" --plot "$OUT/bench-h200/loop-resnet50-${MODE:-graph}.png" -o "$OUT/bench-h200/loop-resnet50-${MODE:-graph}.json"' ;;
    # ConvNeXt-V2's GRN: the kernels' GPU tests, then them against eager and Inductor; its rate
    # (family fused_grn) is `FAMILIES=fused_grn ... calib-nchw`; then the loop on ConvNeXt-V2-T
    grn) run grn "$secs" bash -c 'python3 -m pytest -m gpu -q -p no:cacheprovider -k "not 2_pow_31" tests/kernel_ops/test_grn_gpu.py tests/transforms/test_fuse_grn.py; python3 benchmarks/kernels/bench_grn.py --out "$OUT/bench_grn.json"' ;;
    loop-convnextv2) run loop-convnextv2 "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench timm:convnextv2_tiny --optimize --mode "${MODE:-eager}" --profile "$CALIB_PROFILE" --rounds "${ROUNDS:-5}" --csv "$OUT/bench-h200/loop-lib.csv" -o "$OUT/bench-h200/loop-timm_convnextv2_tiny-${MODE:-eager}.json"' ;;
    loop-gpt2) run loop-gpt2 "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:gpt2 --optimize --csv "$OUT/bench-h200/loop.csv" --plot "$OUT/bench-h200/loop-gpt2.png" -o "$OUT/bench-h200/loop-gpt2.json"' ;;
    loop-bert) run loop-bert "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:bert --batch 32 --optimizer adamw-fused --optimize --csv "$OUT/bench-h200/loop.csv" --plot "$OUT/bench-h200/loop-bert.png" -o "$OUT/bench-h200/loop-bert.json"' ;;
    bench-gpt2) run bench-gpt2 "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:gpt2 --vs "${VS:-optimize,compile,optimize-compile+compile,optimize+graph}" --rounds "${ROUNDS:-5}" --kernels "${KERNELS:-0}" --csv "$OUT/bench-h200/bench.csv" --plot "$OUT/bench-h200/gpt2.png" -o "$OUT/bench-h200/gpt2.json"' ;;
    bench-bert) run bench-bert "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:bert --batch 32 --optimizer adamw-fused --vs "${VS:-optimize,compile,optimize-compile+compile,optimize+graph}" --rounds "${ROUNDS:-5}" --kernels "${KERNELS:-0}" --csv "$OUT/bench-h200/bench.csv" --plot "$OUT/bench-h200/bert.png" -o "$OUT/bench-h200/bert.json"' ;;
    # the families library models need (depthwise convs, LayerNorm at 768 and 384) into the shipped profile
    calib-lib) run calib-lib "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families "${FAMILIES:-grouped_conv,norm@768,norm@384}" --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # eight library models: depthwise convnets, plain and windowed ViTs, GPT-2, a GQA LLaMA, BERT
    # the families the eight library models showed mispriced, by the size or layout their rate
    # depends on (NCHW BatchNorm by channels, LayerNorm rows of 96 and 192, NCHW depthwise by
    # kernel side), the embedding's two passes, layout copies and roll, patch embeddings
    calib-lib2) run calib-lib2 "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families "${FAMILIES:-batch_norm_nchw@16,batch_norm_nchw@32,batch_norm_nchw@64,batch_norm_nchw@128,norm@96,norm@192,grouped_conv_nchw,grouped_conv_nchw@5,grouped_conv_nchw@3,gather,scatter_add,permuted_copy,transposed_copy,roll,patch_conv@4,patch_conv@16}" --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # GPT-2 at batch 16 (issue #17's tokens/s line): torch.compile against optimize-compile + compile
    bench-gpt2-b16) run bench-gpt2-b16 "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:gpt2 --batch 16 --optimizer adamw-fused --vs "${VS16:-compile,optimize-compile+compile}" --rounds "${ROUNDS:-5}" --csv "$OUT/bench-h200/bench.csv" -o "$OUT/bench-h200/gpt2-b16.json"' ;;
    bench-gpt2-b32) run bench-gpt2-b32 "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:gpt2 --batch 32 --optimizer adamw-fused --vs "${VS32:-compile,optimize-compile+compile-graphs}" --rounds "${ROUNDS:-5}" --csv "$OUT/bench-h200/bench.csv" -o "$OUT/bench-h200/gpt2-b32.json"' ;;
    # issue #15's families, new in the cost model and priced as before until measured (pointwise
    # ops on broadcast operands, memory-bound GEMMs, ConvNeXt's 2x2/2 downsampling, the LayerNorm
    # weight-gradient kernel over <= 64k rows) and the LayerNorm rows, whose bytes now count the
    # weight gradients' re-read (re-derived offline until this runs); then run correlate-lib
    # the families the H100's profile measured and the H200's shipped one lacks: the stems
    # (both layouts, space-to-depth), GroupNorm and its kernel, GRN, PoolFormer's average pool,
    # a gradient's NHWC-to-NCHW copy, and the sums by rows and channels (the H100's came from
    # benchmarks/kernels runs; these are the same shapes measured by the probe's workloads);
    # and the cat kernel on permuted inputs (permuted_cat, permuted_stack: derived from timed
    # steps on both chips until the probe measures them)
    calib-h200-missing) run calib-h200-missing "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families "${FAMILIES:-s2d_stem,s2d_stem@2,s2d_fold,nchw_conversion_stem,small_cin_conv@4,group_norm,group_norm@2048,fused_group_norm,fused_grn,avg_pool,avg_pool_nchw,transposed_copy_nchw,permuted_cat,permuted_stack,reduction@12544x96,reduction@12544x192,reduction@12544x384,reduction@50176x96,reduction@50176x192,reduction@50176x384,reduction@200704x96,reduction@200704x192,reduction@200704x384,channel_sum@12544x96,channel_sum@12544x192,channel_sum@12544x384,channel_sum@50176x96,channel_sum@50176x192,channel_sum@50176x384,channel_sum@200704x96,channel_sum@200704x192,channel_sum@200704x384}" --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    calib-lib3) run calib-lib3 "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families "${FAMILIES:-elementwise_strided,gemm,downsample_conv@2,norm_weight_grad,norm,norm@96,norm@192,norm@384,norm@768}" --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # does padding the vocabulary pay under torch.compile (reduce-overhead)? BERT and GPT-2
    stem) run stem "$secs" python3 benchmarks/kernels/probe_stem.py --out "$OUT/probe_stem.json" ;;
    conv-layers) run conv-layers "$secs" python3 benchmarks/steps/conv_layers.py "${MODEL:-torchvision.models:resnet50}" --input "${INPUT:-256x3x224x224}" --out "$OUT/conv_layers.json" ;;
    compile-cache) run compile-cache "$secs" python3 benchmarks/steps/compile_cache.py --out "$OUT/compile_cache.json" ;;
    compile-pad) run compile-pad "$secs" python3 benchmarks/steps/compile_pad.py --out "$OUT/compile_pad.json" ;;
    # issue #16's selective-checkpoint line: GPT-2 with half its activation memory as budget
    checkpoint) run checkpoint "$secs" python3 benchmarks/transforms/bench_checkpoint.py --out "$OUT/bench_checkpoint.json" ;;
    # the five timm models again in channels_last (the library models as built run NCHW)
    correlate-lib-cl) run correlate-lib-cl "$secs" python3 benchmarks/trace/correlate.py --channels-last --stem correlate-lib-cl --models "${MODELS:-timm:mobilenetv3_large_100,timm:efficientnet_b0,timm:convnext_tiny,timm:vit_base_patch16_224,timm:swin_tiny_patch4_window7_224}" ;;
    correlate-lib) run correlate-lib "$secs" python3 benchmarks/trace/correlate.py --stem correlate-lib --models "${MODELS:-timm:mobilenetv3_large_100,timm:efficientnet_b0,timm:convnext_tiny,timm:vit_base_patch16_224,timm:swin_tiny_patch4_window7_224,hf:gpt2,hf:bert,hf:llama?hidden_size=1024&intermediate_size=2816&num_hidden_layers=8&num_attention_heads=16&num_key_value_heads=4&vocab_size=32000}" ;;
    kernels-bert) run kernels-bert "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench hf:bert --batch 32 --optimizer adamw-fused --vs "${VS:-optimize}" --rounds 3 --kernels 30 -o "$OUT/bench-h200/kernels-bert.json"' ;;
    # where an eager step makes the host wait for the GPU, and the GPU's idle gaps
    host-sync) run host-sync "$secs" python3 benchmarks/steps/host_sync.py "${MODEL:-hf:bert}" $([ -n "${INPUT:-}" ] && echo --input "$INPUT" || echo --batch "${BATCH:-32}") --vs "${VS:-eager,optimize}" --out "$OUT/host_sync.json" ;;
    # a real eager step's host time by forward op and backward node (then fit_host_glue.py, on any machine)
    # the same at each model's default batch, the GPU held busy while each pass is issued
    # (so the host never waits on kernels that outlast their issue): does the host's time grow
    # with the batch, as the library loops' steps suggested (GPT-2 at 8 x 1024 stayed at ~32 ms
    # a step while its GPU work fell to 26.9)?
    host-by-op-batch) run host-by-op-batch "$secs" python3 benchmarks/steps/host_by_op.py --batch 0 --hold "${HOLD:-0.3}" --repeats 8 --steps 2 --models "${MODELS:-timm:mobilenetv3_large_100,hf:gpt2,timm:efficientnet_b0,hf:bert}" --out "$OUT/host_by_op_batch.json" ;;
    launch-queue) run launch-queue "$secs" python3 benchmarks/steps/launch_queue.py --out "$OUT/launch_queue.json" ;;
    host-by-op) run host-by-op "$secs" python3 benchmarks/steps/host_by_op.py --models "${MODELS:-timm:resnet50,hf:gpt2,timm:vit_base_patch16_224,timm:efficientnet_b0,hf:bert}" --out "$OUT/host_by_op.json" ;;
    # does an op's host cost grow with its size? (BERT's ops at 1,024 and 16,384 rows)
    host-size) run host-size "$secs" python3 benchmarks/steps/host_by_size.py --out "$OUT/host_by_size.json" ;;
    # what host-side changes buy a host-bound eager step: transform sets, gc frozen
    host-fixes) run host-fixes "$secs" python3 benchmarks/steps/host_fixes.py "${MODEL:-hf:bert}" --batch "${BATCH:-32}" --sets "${SETS:-pad-channels,fuse-norm-act,masked-lm-head;pad-channels,fuse-norm-act,masked-lm-head,fuse-qkv;pad-channels,masked-lm-head}" --out "$OUT/host_fixes.json" ;;
    gputests-graph) run gputests-graph "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider tests/transforms/test_graph_layers_gpu.py tests/transforms/test_bias_grad.py ;;
    # issue #15's loop on the library models with high or medium findings
    # (benchmarks/results/audit-cpu/survey_findings.json): MODE=eager (6 models) or compile (4)
    # (MODE may name both, "compile eager": each model in each mode, in that order)
    loops-lib) run loops-lib "$secs" bash -c 'mkdir -p "$OUT/bench-h200"; for mode in ${MODE:-eager}; do if [ "$mode" = eager ]; then def="timm:mobilenetv3_large_100 timm:efficientnet_b0 timm:vit_base_patch16_224 timm:swin_tiny_patch4_window7_224 hf:gpt2 hf:bert"; else def="timm:mobilenetv3_large_100 timm:efficientnet_b0 timm:swin_tiny_patch4_window7_224 hf:bert"; fi; for m in ${MODELS:-$def}; do s=$(echo "$m" | tr ":/?&=" "_____"); extra=""; [ "$m" = hf:bert ] && extra="--batch 32 --optimizer adamw-fused"; echo "== $m ($mode)"; python3 -m gpushape bench "$m" $extra --optimize --mode "$mode" --rounds "${ROUNDS:-8}" --csv "$OUT/bench-h200/loop-lib.csv" -o "$OUT/bench-h200/loop-$s-$mode.json" 2>&1 | tail -n 25; done; done' ;;
    host-gpt2) run host-gpt2 "$secs" python3 benchmarks/steps/host_profile.py hf:gpt2 --vs "${VS:-eager,optimize}" --out "$OUT/host-gpt2.json" ;;
    # the host's dispatch rates into the shipped profile, then the host model against real steps
    calib-host) run calib-host "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts host --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # compiled steps of timm models the compile-mode host model extrapolates to (kernels and
    # issue time per step, for benchmarks/steps/fit_compile_host.py): the audit predicts them
    # host-bound, several slower than eager (benchmarks/results/audit-cpu/sweep_timm.log)
    compile-host) run compile-host "$secs" bash -c 'mkdir -p "$OUT/bench-h200"; for m in ${MODELS:-timm:densenet121 timm:regnety_016 timm:resnext50_32x4d timm:convnext_tiny timm:vit_small_patch16_224}; do s=$(echo "$m" | tr ":/?&=" "_____"); echo "== $m"; python3 -m gpushape bench "$m" --vs compile --rounds "${ROUNDS:-3}" --csv "$OUT/bench-h200/bench.csv" -o "$OUT/bench-h200/compile-host-$s.json" 2>&1 | tail -n 12; done' ;;
    host-validate) run host-validate "$secs" python3 benchmarks/steps/host_validate.py --models "${MODELS:-hf:bert,hf:gpt2,timm:vit_base_patch16_224,timm:resnet50}" --out "$OUT/host_validate.json" ;;
    gputests-bnact) run gputests-bnact "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider -x -k "not 2_pow_31" tests/kernel_ops/test_batch_norm_act_gpu.py tests/kernel_ops/test_batch_norm_act_smooth.py ;;
    bench-effnet) run bench-effnet "$secs" bash -c 'mkdir -p "$OUT/bench-h200" && python3 -m gpushape bench timm:efficientnet_b0 --vs "${VS:-channels-last,optimize}" --rounds "${ROUNDS:-3}" --kernels 8 --csv "$OUT/bench-h200/bench.csv" -o "$OUT/bench-h200/effnet.json"' ;;
    # a Linear's bias gradient (column sum) by PyTorch, cuBLAS GEMV, Inductor and gpushape
    # a case study of the README's table, with the loss check; its plot named for the run (CASE=resnet|bert|gpt2|gpt2-nodrop)
    case) run "case-${CASE:-resnet}" "$secs" bash -c 'mkdir -p "$OUT/bench-h200"; stamp=$(date -u +%Y%m%d-%H%M); case ${CASE:-resnet} in resnet) m="torchvision.models:resnet50 --input 256x3x224x224"; vs="channels-last+compile,optimize+graph";; bert) m="hf:bert --batch 32 --optimizer adamw-fused"; vs="optimize-compile+fuse-qkv+compile+graph,optimize-compile+fuse-qkv+fuse-dropout-add-norm+compile+graph";; gpt2) m="hf:gpt2 --batch 32 --optimizer adamw-fused"; vs="compile,optimize-compile+compile-graphs";; gpt2-nodrop) m="hf:gpt2?resid_pdrop=0&embd_pdrop=0&attn_pdrop=0 --batch 32 --optimizer adamw-fused"; vs="compile,optimize-compile+compile-graphs";; esac; python3 -m gpushape bench $m --vs "${VS:-$vs}" --rounds "${ROUNDS:-5}" --loss-steps "${LOSS_STEPS:-30}" --kernels "${KERNELS:-12}" --csv "$OUT/bench-h200/bench.csv" --plot "$OUT/bench-h200/case-${CASE:-resnet}-$stamp.png" -o "$OUT/bench-h200/case-${CASE:-resnet}-$stamp.json"' ;;
    guide-resnet) run guide-resnet "$secs" python3 benchmarks/steps/guide_resnet.py --batch "${BATCH:-256}" --variant "${VARIANT:-channels-last+compile}" --out "$OUT/guide_resnet.json" ;;
    # gpushape's max pool: its GPU tests, the kernel against PyTorch's, its family's rate into the
    # shipped profile (which later steps then use)
    pool) run pool "$secs" bash -c 'python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernel_ops/test_max_pool_gpu.py tests/transforms/test_fast_max_pool.py && python3 benchmarks/kernels/bench_max_pool.py --out "$OUT/bench_max_pool.json"' ;;
    calib-pool) run calib-pool "$secs" bash -c 'python3 benchmarks/hardware/calibrate_memory_efficiency.py --parts memory --families fused_max_pool --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    masked-sdpa) run masked-sdpa "$secs" python3 benchmarks/kernels/probe_masked_sdpa.py --out "$OUT/probe_masked_sdpa.json" ;;
    compile-qkv) run compile-qkv "$secs" python3 benchmarks/kernels/probe_compile_qkv.py --dropout "${DROPOUT:-0.1}" --out "$OUT/probe_compile_qkv.json" ;;
    roofline-resnet) run roofline-resnet "$secs" python3 benchmarks/steps/roofline_step.py torchvision.models:resnet50 --input 256x3x224x224 --vs "${VS:-optimize+graph,channels-last+compile}" --target 8000 --out "$OUT/roofline_resnet50.json" ;;
    bias-grad) run bias-grad "$secs" python3 benchmarks/kernels/probe_bias_grad.py --out "$OUT/probe_bias_grad.json" ;;
    # is graph-layers' self-check stable? optimize built several times on one model
    graph-check) run graph-check "$secs" python3 benchmarks/transforms/diagnose_graph_check.py "${MODEL:-hf:bert}" --batch "${BATCH:-32}" --builds "${BUILDS:-3}" --out "$OUT/diagnose_graph_check.json" ;;
    # the full probe's optimizer-step measurement alone, beside the shipped figures
    opt-probe) run opt-probe "$secs" python3 benchmarks/steps/probe_optimizer_kernels.py --out "$OUT/probe_optimizer_kernels.json" ;;
    # SDPA's efficient kernel on short windows (Swin-T's), with and without a bias, beside the cost model
    window-attn) run window-attn "$secs" python3 benchmarks/kernels/probe_window_attention.py --out "$OUT/probe_window_attention.json" ;;
    # the GPU's wait at a boundary between two CUDA graph replays into CALIB_PROFILE
    graph-gap) run graph-gap "$secs" bash -c 'python3 benchmarks/hardware/measure_graph_replay_gap.py --profile "$CALIB_PROFILE" -o "$OUT/$(basename "$CALIB_PROFILE")" && cp "$OUT/$(basename "$CALIB_PROFILE")" "$CALIB_PROFILE"' ;;
    # pytorch#188344 on this torch (PyTorch's channels_last avg-pool backward), the guard's GPU
    # tests, and optimize's check of fuse-group-norm on PoolFormerV2-S12 with the guard in place
    avg-guard) run avg-guard "$secs" bash -c 'python3 benchmarks/kernels/check_avg_pool_nhwc.py; python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernel_ops/test_avg_pool_gpu.py; python3 benchmarks/kernels/check_group_norm_poolformerv2.py --parts 4,3' ;;
    window-bias) run window-bias "$secs" python3 benchmarks/kernels/diagnose_window_bias.py --out "$OUT/diagnose_window_bias.json" ;;
    *) echo "unknown step $name" ;;
  esac
done
# Only a few files come back from the machine: pack everything into one archive.
tar czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
