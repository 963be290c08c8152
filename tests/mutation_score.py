#!/usr/bin/env python3
"""Mutation score of the verifier: every injected parallelism bug (PTOOL_FAULT) over every shipped
case it applies to. Prints the table (class, cases, detected, localised) and fails unless every
mutant is detected and >= 90%
of each class are localised to the right module and phase, and unless the README's table and
docs/testing.md's totals are this run's.

    mutation_score.py PTOOL ROOT

Which cases a class applies to comes from `ptool explain --json` (styled modules, their
collectives, buckets, fully_shard units, ignored parameters, broadcast buffers). Detected: verify
exits 1. Localised: the report names the right place, per class:
  TP forward faults      first divergence is the module's forward output
  TP backward fault      first divergence is the module's input gradient
  shard / broadcast      the state_dict check after construction names the module's parameter
  DP gradient faults     the broken parameter's step-0 gradient fails
  ignored synced         the ignored gradient is reported SYNCED
  stale fully_shard      first divergence is in the unit, at step 1
  HSDP replicate sync    the unit's step-0 gradients fail (each replica kept its own shard group's)
  zero_skip_gather       a step-0 update (parameter) fails
  zero_wrong_group       the root's step-0 gradients (or the step-0 gradient norm) fail
  zero_wrong_offset      a step-0 update (parameter) fails
  grad_scale             the scaled parameter's gradient fails
  clip_local_norm        first divergence is a step-0 gradient
  tied_grad              first divergence is the tied weight's step-0 gradient
  loss_parallel_local    first divergence is a step-0 backward
  dropout_same_mask      first divergence is the dropout's forward output
  recompute_mask         first divergence is a step-0 backward in the dropout's checkpointed module
  sac_stale_output       first divergence is a step-0 backward in the region (op-level selective
                         checkpointing, a step of two microbatches or more)
  masters_rounded        first divergence is a step-0 update
  loss_per_call          (global_tokens on masked targets, several ranks' tokens) first divergence is a step-0 backward
  grad_norm_per_microbatch  (clip_grad_norm, two microbatches or more) first divergence is a step-0 gradient or
                         the step-0 gradient norm
Pipeline cases (tests/data/pipeline; a plan with `pipeline_parallel`, whose stages come from its
split points or layers_per_stage over the module calls explain lists); "in stage S" is a module of
stage S or a parameter of one:
  pp_loss_unscaled       first divergence is a step-0 backward in the last stage
  pp_grad_scaled_twice   first divergence is a step-0 gradient in stage S (under clip_grad_norm, which
                         spreads one stage's scale over every gradient: any step-0 gradient or norm)
  pp_wrong_activation    first divergence is a step-0 forward in stage S+1 (the receiver)
  pp_stale_activation    first divergence is a step-0 backward or gradient in stage S (not run
                         where the stage's first module is checkpointed: it recomputes from its own copy)
  pp_detached_input      first divergence is a step-0 backward or gradient in stage S-1 (the zeros'
                         receiver; a stage of an embedding alone has no input gradient to show them)
  pp_tied_unsynced       first divergence is the tied weight's step-0 gradient
Under interleaved_1f1b a plan has pp x virtual_stages stages, stage s on pp rank s mod pp: STAGE is
the stage's index. The send faults (pp_wrong_activation, pp_detached_input) are not run across a
boundary inside one rank (pp 1: the stages hand over in memory, no send), nor pp_tied_unsynced on
a weight whose stages are all on one rank (they share its one parameter: there is no group).
  pp_clip_stage_norm     first divergence is a step-0 gradient or the step-0 gradient norm
  pp_stage_sync_skipped  a step-0 gradient of stage S fails
  pp_stage_reinit        first divergence is a step-0 gradient in stage S (under clip_grad_norm any step-0
                         gradient or norm)
  pp_weight_skipped      (zero_bubble, zbv, dualpipev) as pp_stage_reinit, and verify's probes name the
                         stage's W and its microbatch (W<m>@<s>)
  pp_weight_doubled      (zero_bubble, zbv, dualpipev) likewise
  pp_weight_freed_input  (zero_bubble, zbv, dualpipev; stages > 0, whose I is not empty) likewise
  pp_weight_before_input (zero_bubble, zbv, dualpipev) the run refuses its lists before any step, naming
                         the stage's W and its I (verify fails the plan: the schedule's localisation)
  cp_position_offset     first divergence is a step-0 forward inside the attention (ring plans: its
                         output at ring step 0)
  cp_permutation_kept    (load-balanced plans) first divergence is a step-0 forward inside the attention
                         (ring plans: its output at ring step 0)
  cp_kv_grads_local      first divergence is a step-0 backward inside the attention (its k/v projections;
                         ring plans: its key gradient after the ring's return hop)
  cp_grads_unsynced      first divergence is a step-0 gradient
  cp_mask_unshifted      (ring plans) first divergence is the attention's step-0 output at ring step 1
  cp_merge_unscaled      (ring plans) first divergence is the attention's step-0 output at ring step 1
  cp_ring_stale_kv       (ring plans) first divergence is the attention's step-0 query gradient at ring step 1
  cp_balance_noncausal   (load-balanced plans, a non-causal attention) first divergence is a step-0 forward
                         inside the attention (ring plans: its output at ring step 0)
  moe_router_unnormalised  first divergence is the moe layer's step-0 routing weights
  moe_aux_unreduced      (a balancing loss, several ranks' tokens) first divergence is the layer's
                         gate's step-0 input gradient
  ep_split_sizes         (expert parallel plans) first divergence is an expert's step-0 output
  ep_expert_misplaced    (expert parallel plans) first divergence is an expert's step-0 output
  ep_combine_unpermuted  (expert parallel plans) first divergence is the moe layer's step-0 output
  ep_grads_wrong_group   (expert parallel plans) first divergence is an expert's step-0 gradient (under
                         clip_grad_norm any step-0 gradient or norm)
  ep_shared_unsynced     (expert parallel plans, a moe with a shared expert) first divergence is the
                         shared expert's step-0 gradient
  moe_tp_grad_unreduced  (tensor parallel experts) first divergence is an expert's step-0 input gradient
  ep_grad_norm_local     (expert parallel plans under clip_grad_norm) first divergence is a step-0 gradient
                         or the step-0 gradient norm
  float8_local_amax      (a float8 linear whose scales cover pieces on other ranks: a tensor-parallel
                         style's) first divergence is the linear's step-0 output
  float8_e4m3_grad       (a tensorwise float8 linear) first divergence is the linear's step-0 input gradient
  float8_scale_unrounded (a rowwise float8 linear) first divergence is the linear's step-0 output
  float8_master          (a float8 linear) first divergence is the step-0 update of its weight
  float8_stale_scale     (a float8 linear under FSDP2's float8 all-gather with precomputed scales, two
                         steps or more) first divergence is the linear's step-1 output
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

PTOOL, ROOT = sys.argv[1], sys.argv[2]

def cases():
    for plan in sorted(glob.glob(f"{ROOT}/plans/*.yaml")):
        name = os.path.basename(plan)[:-5]
        if name.startswith("gemm_mlp") or name == "mpy_bn_local":
            continue  # benchmark-sized; fails by design
        model = re.search(r"models/[a-z_0-9]*\.yaml", open(plan).read()).group(0)
        yield f"{ROOT}/{model}", plan
    for plan in sorted(glob.glob(f"{ROOT}/tests/data/pipeline/*.yaml") + glob.glob(f"{ROOT}/tests/data/float8/*.yaml")):
        model = re.search(r"(tests/data/)?models/[a-z_0-9]*\.yaml", open(plan).read()).group(0)  # named in its header
        yield f"{ROOT}/{model}", plan


def explain(model, plan):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "e.json")
        subprocess.run([PTOOL, "explain", model, plan, "--json", out], capture_output=True, check=True, timeout=60)
        return json.load(open(out))


def mutants(ex, model, plan):
    """(class, fault, check) for one case; check(report) -> localised?"""
    def first_div(text):
        return lambda r: text in r["localisation"]

    def note_names(fqn):
        return lambda r: any("after construction" in n and re.search(rf"(^|[ ,:]){re.escape(fqn)}\.", n) for n in r["notes"])

    def grad_fails(*params):
        names = {f"step0.grad.{p}" for p in params}
        return lambda r: any(t["name"] in names and not t["pass"] for t in r["tensors"])

    comm = {}
    for c in ex["collectives_per_step"]:
        comm.setdefault((c["module"], c["phase"]), set()).add(c["op"])
    last_expert = max((int(e) for m in ex["modules"] for e in re.findall(r"\.experts\.(\d+)\.", m["fqn"] + ".")),
                      default=0)
    if ex["tp"] > 1:
        for m in ex["modules"]:
            fqn, style, linear = m["fqn"], m["style"], m["type"] == "linear"
            # the model's first linear: its input gradient is the model input's, which no parameter
            # depends on (PyTorch does not even compute it): skipping its all_reduce changes nothing
            first = ex["params"] and ex["params"][0] in m["params"]
            # inside a mixture of experts' expert nothing reports events but the expert (its rows are
            # another set of tokens on each rank, model/moe.h): the expert is where a fault shows
            expert = re.match(r"(.*\.experts\.(\d+))\.", fqn)
            shows = expert.group(1) if expert else fqn
            # a layer's experts are copies of one module type under one style: its first and last
            # experts' linears (on the first and the last ep rank under expert parallelism) stand for
            # the rest (CI time; every expert of every layer ran once: all caught)
            if expert and expert.group(2) not in ("0", str(last_expert)):
                continue
            if style == "colwise" and linear and not first:
                yield ("skip_grad_all_reduce", f"skip_grad_all_reduce:{fqn}", first_div(f"backward `{shows}` input gradient"))
            if style == "rowwise" and linear and "all_reduce" in comm.get((fqn, "forward"), set()):
                yield ("skip_all_reduce", f"skip_all_reduce:{fqn}", first_div(f"forward `{shows}` output"))
                if f"{fqn}.bias" in m["params"]:
                    yield ("bias_every_rank", f"bias_every_rank:{fqn}", first_div(f"forward `{fqn}` output"))
            if style in ("colwise", "rowwise") and linear:
                yield ("wrong_shard_dim", f"wrong_shard_dim:{fqn}", note_names(fqn))
                yield ("wrong_shard_offset", f"wrong_shard_offset:{fqn}", note_names(fqn))
            owns = any(p in ex["params"] for p in m["params"])  # a tied module's weight is distributed by its owner
            if style in ("colwise", "rowwise") and ex["src_data_rank"] is not None and owns:
                yield ("wrong_src_rank", f"wrong_src_rank:{fqn}", note_names(fqn))
    if ex["dp"] > 1:
        roots = sorted({b["root"] for b in ex["buckets"]})
        for b in ex["buckets"]:
            yield ("skip_bucket", f"skip_bucket:{b['params'][0]}", grad_fails(*b["params"]))
        for root in roots:  # under clip_grad_norm the clipped gradients hide a scale; their norm does not
            fails = grad_fails(*[p for b in ex["buckets"] if b["root"] == root for p in b["params"]])
            yield ("grad_sum", f"grad_sum:{root if root else '*'}",
                   lambda r, f=fails: f(r) or "step 0 gradient norm" in r["localisation"])
        if ex.get("zero_stage"):  # ZeRO: the shards' all_gather, the group the buckets reduce over, the offset
            def update_fails(r):
                return "step 0 update of" in r["localisation"] or any(
                    t["name"].startswith("step0.param.") and not t["pass"] for t in r["tensors"])
            for root in roots:
                fails = grad_fails(*[p for b in ex["buckets"] if b["root"] == root for p in b["params"]])
                yield ("zero_skip_gather", f"zero_skip_gather:{root if root else '*'}", update_fails)
                yield ("zero_wrong_group", f"zero_wrong_group:{root if root else '*'}",
                       lambda r, f=fails: f(r) or "step 0 gradient norm" in r["localisation"])
            yield ("zero_wrong_offset", "zero_wrong_offset:*", update_fails)
        if ex["synced_buffers"]:
            buf = ex["synced_buffers"][0]
            yield ("skip_buffer_broadcast", "skip_buffer_broadcast:*",
                   lambda r, b=buf: any("after construction" in n and b in n for n in r["notes"]))
        if ex["ignored_params"]:
            p = ex["ignored_params"][0]
            yield ("sync_ignored", "sync_ignored:*",
                   lambda r, p=p: any(t["name"] == f"step0.grad.{p}" and t["replicas"] == "SYNCED" for t in r["tensors"]))
        for u in ex["units"]:
            if not u["params"]:
                continue
            unit = u["fqn"] if u["fqn"] else "*"
            yield ("skip_reduce_scatter", f"skip_reduce_scatter:{unit}", grad_fails(*u["params"]))
            prefix = f"`{u['fqn']}" if u["fqn"] else "`"
            yield ("stale_param", f"stale_param:{unit}", lambda r, pre=prefix: "step 1 forward " + pre in r["localisation"])
            if "all_reduce" in comm.get((u["fqn"], "backward"), set()):  # HSDP: the shard's all_reduce over dp_replicate
                yield ("skip_replicate_all_reduce", f"skip_replicate_all_reduce:{unit}", grad_fails(*u["params"]))
    yield from training_mutants(ex, first_div, grad_fails)
    yield from pipeline_mutants(ex, model, plan, grad_fails)
    yield from context_mutants(ex, first_div)
    yield from expert_mutants(ex, first_div, model)
    yield from float8_mutants(ex, first_div)


def float8_mutants(ex, first_div):
    """The float8 classes, on every linear the plan's float8 section converts (explain --json's
    float8.linears): a piece scaled by its own amax where the linear's scales cover pieces on other
    ranks (a tensor-parallel style's) shows first in the linear's forward output (tensorwise: rowwise
    scales are powers of 2, so a piece's own amax moves no value out of e4m3fn's normal range, an
    equivalent mutant on ordinary data); the output gradient cast to e4m3fn in its input gradient;
    rowwise scales left unrounded in the linear's forward output."""
    if not ex.get("float8"):
        return
    styled = {m["fqn"] for m in ex["modules"] if m["style"] in ("colwise", "rowwise")} if ex["tp"] > 1 else set()
    for fqn in ex["float8"]["linears"]:
        if fqn in styled and ex["float8"]["recipe"] == "tensorwise":
            yield ("float8_local_amax", f"float8_local_amax:{fqn}", first_div(f"step 0 forward `{fqn}` output"))
        if ex["float8"]["recipe"] == "tensorwise":  # rowwise casts every operand to e4m3fn anyway
            yield ("float8_e4m3_grad", f"float8_e4m3_grad:{fqn}", first_div(f"step 0 backward `{fqn}` input gradient"))
        else:  # scales as the amaxes give them, not rounded down to powers of 2
            yield ("float8_scale_unrounded", f"float8_scale_unrounded:{fqn}",
                   first_div(f"step 0 forward `{fqn}` output"))
        yield ("float8_master", f"float8_master:{fqn}", first_div(f"step 0 update of `{fqn}.weight`"))
        if ex["float8"].get("precompute_scale"):  # FSDP2's float8 all-gather, its scales precomputed
            yield ("float8_stale_scale", f"float8_stale_scale:{fqn}", first_div(f"step 1 forward `{fqn}` output"))


def expert_mutants(ex, first_div, model):
    """The mixture-of-experts classes, on every moe layer: the router's renormalisation flipped shows
    first in the layer's routing weights (its gate's logits agree). Under expert parallelism: rows
    computed by the wrong expert (split sizes off by one, an expert's rows sent to the rank before)
    show first in an expert's output; the combine that does not invert the dispatch's permutation in
    the layer's output after its experts agree; the experts' gradients not divided by ep in an
    expert's gradient; a shared expert left out of data parallel's sync in its gradient. A
    load-balancing loss taken over each rank's own tokens (where several ranks hold different tokens)
    shows first in the layer's gate's input gradient."""
    ep = ex.get("expert_parallel")
    text = open(model).read()
    balanced = re.search(r"aux_loss_coef: *(0\.0*[1-9]|[1-9])", text) is not None
    token_ranks = ex["dp"] * ((ex.get("context_parallel") or {}).get("cp") or 1)
    clipped = ex.get("clip_grad_norm", 0) > 0
    if ep and ep["ep"] > 1 and clipped:
        yield ("ep_grad_norm_local", "ep_grad_norm_local:*", first_div("first divergence: step 0 gradient"))
    styled_experts = {m["fqn"].split(".experts.")[0] for m in ex["modules"]
                      if ".experts." in m["fqn"] and m["style"] == "colwise"} if ex["tp"] > 1 else set()
    for c in ex["calls"]:
        if c["type"] != "moe":
            continue
        fqn = c["fqn"]
        if fqn in styled_experts:  # the experts' input gradients are partial over tp
            yield ("moe_tp_grad_unreduced", f"moe_tp_grad_unreduced:{fqn}", first_div(f"step 0 backward `{fqn}.experts."))
        yield ("moe_router_unnormalised", f"moe_router_unnormalised:{fqn}",
               first_div(f"step 0 forward `{fqn}` routing weights"))
        if balanced and token_ranks > 1:
            yield ("moe_aux_unreduced", f"moe_aux_unreduced:{fqn}", first_div(f"step 0 backward `{fqn}.gate` input gradient"))
        if not ep or ep["ep"] < 2:
            continue
        expert_out = first_div(f"step 0 forward `{fqn}.experts.")
        yield ("ep_split_sizes", f"ep_split_sizes:{fqn}", expert_out)
        yield ("ep_expert_misplaced", f"ep_expert_misplaced:{fqn}", expert_out)
        yield ("ep_combine_unpermuted", f"ep_combine_unpermuted:{fqn}", first_div(f"step 0 forward `{fqn}` output"))
        # (under clip_grad_norm the experts' wrong scale moves the norm, and clipping spreads it over every gradient)
        yield ("ep_grads_wrong_group", f"ep_grads_wrong_group:{fqn}",
               first_div("first divergence: step 0 gradient") if clipped else first_div(f"step 0 gradient of `{fqn}.experts."))
        if any(p.startswith(f"{fqn}.shared_expert.") for p in ex["params"]):
            yield ("ep_shared_unsynced", f"ep_shared_unsynced:{fqn}",
                   first_div(f"step 0 gradient of `{fqn}.shared_expert."))


def context_mutants(ex, first_div):
    """The context parallel classes, on a plan whose cp dim has more than one rank: each attention's
    positions and key/value gradients, the load-balancing permutation, the gradients' average."""
    cp = ex.get("context_parallel")
    if not cp or cp["cp"] < 2:
        return
    for c in ex["calls"]:
        if c["type"] != "attention":
            continue
        fqn = c["fqn"]
        if cp.get("rotate_method") == "alltoall":
            # the ring localises to its step: wrong positions at step 0 (the rank's own block), the
            # unshifted mask and the unscaled merge at step 1 (the first block that came round), the
            # gradients not sent home at the key/value gradients after the ring
            parts = cp["cp"]
            at_step0 = first_div(f"step 0 forward `{fqn}` output at ring step 0 of {parts}")
            at_step1 = first_div(f"step 0 forward `{fqn}` output at ring step 1 of {parts}")
            yield ("cp_position_offset", f"cp_position_offset:{fqn}", at_step0)
            # a non-causal attention reads every key of a block alike: the order the keys come in and the
            # mask of a block are its causal mask's business (equivalent mutants there)
            causal = c.get("causal", True)
            if cp["load_balance"] and causal:
                yield ("cp_permutation_kept", f"cp_permutation_kept:{fqn}", at_step0)
            yield ("cp_kv_grads_local", f"cp_kv_grads_local:{fqn}",
                   first_div(f"step 0 backward `{fqn}` key gradient after the ring's return hop"))
            if causal:
                yield ("cp_mask_unshifted", f"cp_mask_unshifted:{fqn}", at_step1)
            yield ("cp_merge_unscaled", f"cp_merge_unscaled:{fqn}", at_step1)
            yield ("cp_ring_stale_kv", f"cp_ring_stale_kv:{fqn}",
                   first_div(f"step 0 backward `{fqn}` query gradient at ring step 1 of {parts}"))
            if cp["load_balance"] and not c.get("causal", True):
                yield ("cp_balance_noncausal", f"cp_balance_noncausal:{fqn}", at_step0)
            continue
        if cp["load_balance"] and not c.get("causal", True):
            yield ("cp_balance_noncausal", f"cp_balance_noncausal:{fqn}", first_div(f"step 0 forward `{fqn}"))
        yield ("cp_position_offset", f"cp_position_offset:{fqn}", first_div(f"step 0 forward `{fqn}."))
        if cp["load_balance"] and c.get("causal", True):
            yield ("cp_permutation_kept", f"cp_permutation_kept:{fqn}", first_div(f"step 0 forward `{fqn}."))
        yield ("cp_kv_grads_local", f"cp_kv_grads_local:{fqn}", first_div(f"step 0 backward `{fqn}."))
    # fully_shard over dp_shard x cp averages its units' gradients over cp itself: the class applies
    # where some parameter is not in a unit (its gradient all_reduced over cp)
    in_units = {p for u in ex["units"] for p in u["params"]}
    if any(p not in in_units for p in ex["params"]):
        yield ("cp_grads_unsynced", "cp_grads_unsynced:*", first_div("step 0 gradient of"))


def training_mutants(ex, first_div, grad_fails):
    """The training configurations' fault classes (ptool's verify/faults.h)."""
    world = ex["tp"] * ex["dp"] * ((ex.get("context_parallel") or {}).get("cp") or 1)
    calls = ex.get("calls", [])
    ignored = set(ex["ignored_params"])
    # one rank's gradient 0.1% off: the head's weight, a weight in the middle of the model and the last bias. Not
    # under bf16 mixed precision, whose compute rounds at 0.4% (below its resolution, docs/testing.md)
    # (an expert's under expert parallelism lives on its owner alone, not on the rank the class scales:
    # ep_grads_wrong_group is its class)
    ep = ex.get("expert_parallel")
    experts = re.compile(r"\.experts\.\d+\.") if ep and ep["ep"] > 1 else None
    weights = [p for p in ex["params"] if p.endswith(".weight") and p not in ignored
               and not (experts and experts.search(p))]
    # and the last bias: a gradient small beside its module's weight's, judged against its own norm
    biases = [p for p in ex["params"] if p.endswith(".bias") and p not in ignored
              and not (experts and experts.search(p))]
    if world > 1 and weights and not ex.get("mixed_precision"):
        for p in sorted({weights[-1], weights[len(weights) // 2]} | set(biases[-1:])):
            yield ("grad_scale", f"grad_scale:{p}",
                   lambda r, p=p: grad_fails(p)(r) or f"gradient of `{p}`" in r["localisation"])
    # clipping by each rank's own norm: only where some gradient is sharded (tp, or fully_shard)
    if ex.get("clip_grad_norm", 0) > 0 and (ex["tp"] > 1 or ex["units"]):
        yield ("clip_local_norm", "clip_local_norm:*", lambda r: "step 0 gradient" in r["localisation"])
    for t in ex.get("tied", []):  # one use of a tied weight adds nothing to its gradient
        for m in t["modules"][1:]:
            yield ("tied_grad", f"tied_grad:{m}", lambda r, p=t["param"]: f"step 0 gradient of `{p}`" in r["localisation"])
    if ex.get("loss_parallel") and ex["tp"] > 1:
        yield ("loss_parallel_local", "loss_parallel_local:*", first_div("step 0 backward"))
    for c in calls:
        if c["type"] != "dropout" or c.get("p", 0) == 0:
            continue
        if ex["tp"] > 1 and c["in"].startswith("Shard"):  # a sharded activation: each rank its own part of the mask
            yield ("dropout_same_mask", f"dropout_same_mask:{c['fqn']}", first_div(f"step 0 forward `{c['fqn']}` output"))
    checkpointed = [c["fqn"] for c in calls if c["checkpointed"]]
    for c in calls:  # the recompute's mask differs: the first backward to use what it recomputed
        region = next((a for a in checkpointed if c["fqn"].startswith(a + ".")), None)
        if c["type"] == "dropout" and c.get("p", 0) > 0 and region:
            yield ("recompute_mask", f"recompute_mask:{c['fqn']}", first_div(f"step 0 backward `{region}."))
    # the op policy's kept outputs looked up one microbatch off: needs a second microbatch
    microbatches = ex.get("gradient_accumulation", 1) * ((ex.get("pipeline") or {}).get("microbatches") or 1)
    for c in calls:
        if c.get("recompute") == "op" and microbatches >= 2:
            yield ("sac_stale_output", f"sac_stale_output:{c['fqn']}", first_div(f"step 0 backward `{c['fqn']}."))
    # the global count run per call: each rank's own mean, averaged; differs where the ranks' pieces hold
    # different counts of valid targets (masked targets) and several ranks hold different tokens
    loss = ex.get("loss") or {}
    if loss.get("normalization") == "global_tokens" and ex.get("masked_targets") and \
            ex["dp"] * ((ex.get("context_parallel") or {}).get("cp") or 1) > 1:
        yield ("loss_per_call", "loss_per_call:*", first_div("step 0 backward"))
    if ex.get("clip_grad_norm", 0) > 0 and microbatches >= 2:
        yield ("grad_norm_per_microbatch", "grad_norm_per_microbatch:*", first_div("first divergence: step 0 gradient"))
    if ex.get("mixed_precision"):  # the optimizer stepping param_dtype values: no float32 masters
        yield ("masters_rounded", "masters_rounded:*", first_div("step 0 update of"))


def pipeline_mutants(ex, model, plan, grad_fails):
    """The pipeline classes, on a plan with `pipeline_parallel` (explain does not describe pipelines:
    the stages come from the plan's YAML and the order of explain's module calls)."""
    p, m = yaml.safe_load(open(plan)), yaml.safe_load(open(model))
    pipe = p.get("pipeline_parallel")
    if pipe is None:
        return
    # interleaved_1f1b: virtual_stages (2 unless given) stages per pp rank, stage s on rank s mod pp;
    # zbv and dualpipev: 2 per rank in a V, stages s and 2 pp - 1 - s on rank s. A fault's STAGE is
    # the stage's index, as the reports and explain number stages
    pp = p["mesh"][pipe.get("mesh_dim", "pp")]
    v_placed = pipe.get("schedule") in ("zbv", "dualpipev", "ZBVZeroBubble", "DualPipeV")
    two = v_placed or pipe.get("schedule") in ("interleaved_1f1b", "Interleaved1F1B")
    stages = pp * pipe.get("virtual_stages", 2 if two else 1)
    split = v_placed or pipe.get("schedule") in ("zero_bubble", "InterleavedZeroBubble")  # I and W

    def rank_of(s):
        return min(s, stages - 1 - s) if v_placed else s % pp

    order = [c["fqn"] for c in ex["calls"]]

    def pos(fqn):  # where a module's subtree is first called
        return min(i for i, f in enumerate(order) if f == fqn or f.startswith(fqn + "."))

    if "split_points" in pipe:
        splits = pipe["split_points"]
    else:  # layers_per_stage (else even) blocks per stage: a repeat's members, in call order
        blocks = list(dict.fromkeys(f for f in order if re.fullmatch(r"[A-Za-z_]\w*\.\d+", f)))
        k = pipe.get("layers_per_stage", len(blocks) // stages)
        splits = [blocks[k * s] for s in range(1, stages)]
    cuts = [pos(f) for f in splits]
    checkpointed = {c["fqn"] for c in ex["calls"] if c["checkpointed"]}

    def stage_of(fqn):  # a module's or a parameter's
        while fqn and not any(f == fqn or f.startswith(fqn + ".") for f in order):
            fqn = fqn.rpartition(".")[0]
        return sum(pos(fqn) >= c for c in cuts)

    tied = {t["param"]: {stage_of(f) for f in t["modules"]} for t in ex.get("tied", [])}

    def at(kind, stage):  # first divergence: a step-0 `kind` ("backward", "forward", "gradient of") in the
        def check(r):    # stage (a weight tied across stages is every holder's: its gradient is their sum)
            hit = re.search(rf"first divergence: step 0 {kind} `([^`]*)`", r["localisation"])
            return hit is not None and stage in tied.get(hit.group(1), {stage_of(hit.group(1))})
        return check

    clipped = m.get("clip_grad_norm", 0) > 0
    params = ex["params"]
    # grad_scale (training_mutants picks the last weight and the middle one: the last stage's) on a
    # weight of each other stage, scaled by that stage's last rank
    weights = [q for q in params if q.endswith(".weight") and q not in ex["ignored_params"]]
    picked = {weights[-1], weights[len(weights) // 2]} if weights else set()
    for s in range(stages):
        held = [q for q in weights if stage_of(q) == s]
        if held and not picked & set(held) and not ex.get("mixed_precision"):
            q = held[len(held) // 2]
            yield ("grad_scale", f"grad_scale:{q}",
                   lambda r, q=q: grad_fails(q)(r) or f"gradient of `{q}`" in r["localisation"])
    yield ("pp_loss_unscaled", "pp_loss_unscaled:*", at("backward", stages - 1))
    for s in range(stages):
        mine = [q for q in params if stage_of(q) == s]
        yield ("pp_grad_scaled_twice", f"pp_grad_scaled_twice:{s}",
               (lambda r: "first divergence: step 0 gradient" in r["localisation"]) if clipped else at("gradient of", s))
        # the send faults break a p2p send: where two consecutive stages live on one rank (pp 1
        # under interleaved_1f1b) the output is handed on in memory, and no send carries it
        if s + 1 < stages and rank_of(s + 1) != rank_of(s):
            yield ("pp_wrong_activation", f"pp_wrong_activation:{s}", at("forward", s + 1))
        # the stage's saved input: a hook on its first module, received or handed on (a checkpointed
        # first module recomputes from its own copy of the input: the fault's buffer is not used)
        if s > 0 and splits[s - 1] not in checkpointed:
            yield ("pp_stale_activation", f"pp_stale_activation:{s}",
                   lambda r, s=s: at("backward", s)(r) or at("gradient of", s)(r))
        if s > 0 and rank_of(s - 1) != rank_of(s):
            # the receiver's backward; a stage of an embedding alone (its input the tokens) computes
            # no input gradient, and the zeros first show in its weight's gradient
            yield ("pp_detached_input", f"pp_detached_input:{s}",
                   lambda r, s=s: at("backward", s - 1)(r) or at("gradient of", s - 1)(r))
        if p.get("data_parallel") and mine:
            yield ("pp_stage_sync_skipped", f"pp_stage_sync_skipped:{s}", grad_fails(*mine))
        if mine:  # the stage's gradients zeroed before each of its microbatches' backward
            yield ("pp_stage_reinit", f"pp_stage_reinit:{s}",
                   (lambda r: "first divergence: step 0 gradient" in r["localisation"]) if clipped else at("gradient of", s))
        # a split backward's first W of the step on the stage: skipped, added twice, reading its
        # activations as freed memory (the first stage's W is its whole backward: no I kept them)
        in_stage = (lambda r: "first divergence: step 0 gradient" in r["localisation"]) if clipped else at("gradient of", s)
        # and verify's probes name the W: its stage and microbatch (verify/weight_probe.h)
        the_w = lambda r, s=s, f=in_stage: f(r) and re.search(
            rf"the split backward's W(\d+)@{s} \(stage {s}, microbatch \1,", r["localisation"]) is not None
        if mine and split:
            yield ("pp_weight_skipped", f"pp_weight_skipped:{s}", the_w)
            yield ("pp_weight_doubled", f"pp_weight_doubled:{s}", the_w)
        if mine and split and s > 0:
            yield ("pp_weight_freed_input", f"pp_weight_freed_input:{s}", the_w)
        if split:  # the stage's first W moved before its I: the run's check of its lists names both
            yield ("pp_weight_before_input", f"pp_weight_before_input:{s}",
                   lambda r, s=s: "the schedule, before any step" in r["localisation"] and re.search(
                       rf"(runs W(\d+)@{s} before I\2@{s}|\(stage {s}\) runs W(\d+) before I\3\b)",
                       r["localisation"]) is not None)
    for q, holders in tied.items():  # tied across stages of two or more ranks (uses on stages of one
        if len({rank_of(h) for h in holders}) > 1:  # rank share its one parameter: no group to skip)
            yield ("pp_tied_unsynced", f"pp_tied_unsynced:{q}",
                   lambda r, q=q: f"first divergence: step 0 gradient of `{q}`" in r["localisation"])
    if clipped:
        yield ("pp_clip_stage_norm", "pp_clip_stage_norm:*", lambda r: "first divergence: step 0 gradient" in r["localisation"])


def main():
    table, misses = {}, []
    for model, plan in cases():
        ex = explain(model, plan)
        for cls, fault, localised in mutants(ex, model, plan):
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "r.json")
                p = subprocess.run([PTOOL, "verify", model, plan, "--json", out, "-q"], capture_output=True, text=True,
                                   env=dict(os.environ, PTOOL_FAULT=fault), timeout=120)
                rep = json.load(open(out))["plans"][0] if os.path.exists(out) else None
            row = table.setdefault(cls, [set(), 0, 0, 0])
            row[0].add(os.path.basename(plan))
            row[1] += 1
            det = p.returncode == 1
            loc = det and rep is not None and localised(rep)
            row[2] += det
            row[3] += loc
            if not loc:
                misses.append(f"{cls}: {fault} on {os.path.basename(plan)}: exit {p.returncode}, "
                              f"{'not localised: ' + (rep['localisation'] if rep else '') if det else 'NOT DETECTED'}")
    lines = [f"{'class':<26} {'cases':>5} {'mutants':>7} {'detected':>9} {'localised':>9}"]
    ok = True
    for cls, (plans, n, det, loc) in sorted(table.items()):
        lines.append(f"{cls:<26} {len(plans):>5} {n:>7} {det:>4} {100 * det / n:3.0f}% {loc:>4} {100 * loc / n:3.0f}%")
        ok = ok and det == n and loc >= 0.9 * n
    total, detected, localised = (sum(r[i] for r in table.values()) for i in (1, 2, 3))
    cases_hit = len(set().union(*(r[0] for r in table.values())))
    lines.append(f"{len(table)} classes, {total} mutants: detected {detected}, localised {localised}")
    print("\n".join(lines))
    for m in misses:
        print("  miss:", m)
    ok = ok and len(table) >= 20
    # the README's table and docs/testing.md's totals are this run's
    readme = open(f"{ROOT}/README.md").read().splitlines()
    start = readme.index(lines[0]) if lines[0] in readme else -1
    if start < 0 or readme[start:start + len(lines)] != lines:
        print("README.md's mutation table is not this run's (paste the table above)")
        ok = False
    ran = len(list(cases()))
    claim = re.search(r"Measured: (\d+) mutants over (\d+) cases \((\d+) with a fault that applies\), (\d+) detected, (\d+) localised",
                      " ".join(open(f"{ROOT}/docs/testing.md").read().split()))
    if not claim or tuple(map(int, claim.groups())) != (total, ran, cases_hit, detected, localised):
        print(f"docs/testing.md says {claim and claim.group(0)!r}; this run: {total} mutants over {ran} cases ({cases_hit} "
              f"with a fault that applies), {detected} detected, {localised} localised")
        ok = False
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


main()
