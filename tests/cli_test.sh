#!/usr/bin/env bash
# End-to-end tests of the ptool binary: exit codes (0/2), messages on stderr, --dump output.
#   bash tests/cli_test.sh build/cli/ptool .
set -u
ptool=$1
root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

expect() {  # expect CODE "stderr fragment" -- command...
    local code=$1 frag=$2
    shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [[ $rc -ne $code ]] || ! grep -qF -- "$frag" "$tmp/err" "$tmp/out"; then
        echo "FAIL: $* -> exit $rc (want $code), output:"; cat "$tmp/out" "$tmp/err"
        failures=$((failures + 1))
    else
        passes=$((passes + 1))
    fi
}

expect 0 "step   1  loss" -- "$ptool" run "$root/models/mlp.yaml"
expect 0 "Run single-device training" -- "$ptool" run --help
expect 0 "run" -- "$ptool" --help
expect 0 "  OpenBLAS: OpenBLAS" -- "$ptool" --version   # with the build's CUDA, NCCL and MPI
expect 0 "  MPI: " -- "$ptool" --version
expect 0 "  CUDA: " -- "$ptool" --version
expect 2 "no such file" -- "$ptool" run "$tmp/none.yaml"
printf 'batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: linaer, in: 2, out: 2}\n' >"$tmp/bad.yaml"
expect 2 "bad.yaml:3:21: unknown module type 'linaer' (did you mean 'linear'?)" -- "$ptool" run "$tmp/bad.yaml"
expect 2 "unknown dtype 'float8'" -- "$ptool" run "$root/models/mlp.yaml" --dtype float8
expect 2 "" -- "$ptool" run "$root/models/mlp.yaml" --steps -1
expect 2 "" -- "$ptool" frobnicate
head -c 20 /dev/urandom >"$tmp/junk.safetensors"
expect 2 "junk.safetensors" -- "$ptool" run "$root/models/mlp.yaml" --init "$tmp/junk.safetensors"
expect 0 "wrote" -- "$ptool" run "$root/models/mlp.yaml" --dump "$tmp/d.safetensors"
# loss: mean of signed outputs near 0 in bf16: the loss is allowed what its outputs are (it failed
# at 30 ULPs of a 0.003 mean whose every output agreed); threads: the rank-local comparison
expect 0 "PASS 132/132" -- "$ptool" verify "$root/tests/data/models/mlp_stacked_8.yaml" \
    "$root/tests/data/pipeline/mlp8_pp2_v2_dp2_tp2_fsdp.yaml" --dtype bfloat16
# a float32 golden replayed in bf16 is judged by bf16's rule (it was judged by the golden's
# recorded float32 rtol and failed)
expect 0 "1 passed, 0 failed" -- "$ptool" verify "$root/golden/gpt_block_tp.safetensors" --dtype bfloat16
# an uneven shard's pieces: each rank's up to 16 ranks, runs of equal pieces past them
expect 0 "16 output features over 3 ranks are uneven (6, 6, 4)" -- "$ptool" explain "$root/models/mlp.yaml" \
    "$root/plans/mlp_root_module.yaml" --mesh tp=3
expect 0 "16 output features over 32 ranks are uneven (1 x 16, 0 x 16)" -- "$ptool" explain \
    "$root/models/mlp.yaml" "$root/plans/mlp_root_module.yaml" --mesh tp=32
# a golden recorded in bf16 replays in bf16 (it replayed in the model's float32 and failed)
expect 0 "wrote" -- "$ptool" golden record "$root/tests/data/models/mlp_stacked_8.yaml" \
    "$root/tests/data/pipeline/mlp8_pp2_v2_dp2_tp2_fsdp.yaml" --dtype bfloat16 -o "$tmp/bf16.safetensors"
expect 0 "1 passed, 0 failed" -- "$ptool" verify "$tmp/bf16.safetensors"
# ... and `verify MODEL PLAN --golden` runs in it too (it ran in float32, judged by bf16's rule)
expect 0 "parallel vs golden: PASS" -- "$ptool" verify "$root/tests/data/models/mlp_stacked_8.yaml" \
    "$root/tests/data/pipeline/mlp8_pp2_v2_dp2_tp2_fsdp.yaml" --golden "$tmp/bf16.safetensors" --json "$tmp/g.json"
expect 0 "ran in bf16" -- python3 -c "import json; d = json.load(open('$tmp/g.json'))
loss = [t for t in d['plans'][0]['tensors'] if t['name'] == 'step0.loss'][0]
print('ran in bf16' if loss['max_abs'] > 1e-5 else 'ran in float32: step0.loss parts by %g' % loss['max_abs'])"
expect 1 "reference vs golden: FAIL" -- "$ptool" verify "$root/tests/data/models/mlp_stacked_8.yaml" \
    "$root/tests/data/pipeline/mlp8_pp2_v2_dp2_tp2_fsdp.yaml" --golden "$tmp/bf16.safetensors" --dtype float32
# --update in another dtype writes that dtype and its rule (it kept bf16's: the next replay failed)
expect 0 "1 updated" -- "$ptool" verify "$tmp/bf16.safetensors" --dtype float32 --update
expect 0 "1 passed, 0 failed" -- "$ptool" verify "$tmp/bf16.safetensors"
# a case that cannot run as asked (float8 in float16) is REFUSED with its error, the others still
# run, and the command exits 2 once all have (it stopped at the refused case, the rest unrun)
expect 2 "float8 with float16 compute" -- "$ptool" verify "$root/golden/float8_llama_rope_ddp_float8_rowwise.safetensors" \
    "$root/golden/gpt_block_tp.safetensors" --dtype float16 --junit "$tmp/refused.xml"
cp "$tmp/out" "$tmp/refused.out"
expect 0 "1 passed, 0 failed, 0 stale, 0 updated, 1 refused" -- cat "$tmp/refused.out"
expect 0 "float8_llama_rope_ddp_float8_rowwise.safetensors: REFUSED" -- cat "$tmp/refused.out"
expect 0 'type="refused"' -- cat "$tmp/refused.xml"
# an option given "" (an unset shell variable) is refused naming it: --golden "" compared with nothing
# and passed, --init/--data/--dtype/--cluster "" were ignored
expect 2 "--golden: an empty value" -- "$ptool" verify "$root/models/mlp.yaml" "$root/plans/mlp_root_module.yaml" --golden ""
expect 2 "--cluster: an empty value" -- "$ptool" explain "$root/models/mlp.yaml" "$root/plans/mlp_root_module.yaml" --cluster ""
expect 2 "MODEL: an empty value" -- "$ptool" run ""
# the dump is a safetensors file with golden keys: its init params load back as --init
python3 - "$tmp/d.safetensors" "$tmp/init.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
h = json.loads(data[8:8 + n])
for key in ["init.param.net1.weight", "data.input", "step0.loss", "step1.grad.net2.bias", "step1.param.net1.weight"]:
    assert key in h, key
assert h["init.param.net1.weight"]["shape"] == [16, 10]
keep = {k: v for k, v in h.items() if k.startswith("init.param.")}
blob, out, off = b"", {}, 0
for k, v in keep.items():
    b, e = v["data_offsets"]
    chunk = data[8 + n + b:8 + n + e]
    out[k[len("init.param."):]] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(chunk)]}
    blob += chunk; off += len(chunk)
hdr = json.dumps(out).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hdr)) + hdr + blob)
PY
"$ptool" run "$root/models/mlp.yaml" -q --dump "$tmp/d2.safetensors" --init "$tmp/init.safetensors"
if cmp -s "$tmp/d.safetensors" "$tmp/d2.safetensors"; then passes=$((passes + 1)); else
    echo "FAIL: --init with the dumped parameters changed the results"; failures=$((failures + 1)); fi

# the all-module-types example of docs/model_format.md runs as written
{ printf 'batch:\n  input: {tokens: [2, 8], vocab: 64}\nsteps: 2\n'
  awk '/^```yaml$/{n++; next} n==2 && /^```$/{exit} n==2{print}' "$root/docs/model_format.md"; } >"$tmp/doc_example.yaml"
expect 0 "step   1  loss" -- "$ptool" run "$tmp/doc_example.yaml"

mpirun=(timeout 120 mpirun --oversubscribe --allow-run-as-root)
# --device cuda: on a GPU the same verdict as on the CPU; without one it says why (2: a build
# without CUDA; 3: no device), before any rank starts
expect 2 "--tf32 applies to --device cuda" -- "$ptool" verify "$root/models/mlp_stacked.yaml" "$root/plans/mlp_stacked_multi_wildcard.yaml" --tf32
"$ptool" run "$root/models/mlp.yaml" --device cuda -q >"$tmp/cuda_out" 2>&1
cuda_rc=$?
case $cuda_rc in
  0) expect 0 "PASS" -- "$ptool" verify "$root/models/mlp_stacked.yaml" "$root/plans/mlp_stacked_multi_wildcard.yaml" --device cuda
     expect 0 "PASS" -- "$ptool" verify "$root/golden" --device cuda
     # mpirun: one process per GPU over NCCL (a 1-rank mesh fits every GPU machine); more ranks
     # on the node than GPUs is an input error naming both counts
     gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
     expect 0 "ranks (nccl)" -- "${mpirun[@]}" -np 1 "$ptool" verify "$root/models/mlp_stacked_mse.yaml" "$root/plans/mlp_stacked_dp2_tp2.yaml" --mesh dp=1 --mesh tp=1 --device cuda
     expect 2 "sees $gpus GPU" -- "${mpirun[@]}" -np $((gpus + 1)) "$ptool" verify "$root/models/mlp_stacked_mse.yaml" "$root/plans/mlp_stacked_dp2_tp2.yaml" --device cuda ;;
  2) expect 2 "built without CUDA support" -- "$ptool" run "$root/models/mlp.yaml" --device cuda ;;
  3) expect 3 "no CUDA device is available" -- "$ptool" verify "$root/models/mlp_stacked.yaml" "$root/plans/mlp_stacked_multi_wildcard.yaml" --device cuda
     expect 3 "no CUDA device is available on this node" -- "${mpirun[@]}" -np 2 "$ptool" verify "$root/models/mlp_stacked_mse.yaml" "$root/plans/mlp_stacked_dp2_tp2.yaml" --mesh tp=1 --device cuda ;;
  *) echo "FAIL: ptool run --device cuda exited $cuda_rc"; cat "$tmp/cuda_out"; failures=$((failures + 1)) ;;
esac

echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
