"""Validation of ptool's --json documents against docs/schema/ (JSON Schema 2020-12).

As a module: validate(doc, kind) -> None or the first error. As a test:
    python3 tests/json_schema.py PTOOL ROOT
checks each schema accepts a fresh document of its kind and refuses ones with a field removed, a
wrong type or another schema_version (so a passing validation means something)."""
import copy
import json
import os
import subprocess
import sys
import tempfile

import jsonschema

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "schema")
_store = {}
for f in os.listdir(SCHEMA_DIR):
    if f.endswith(".schema.json"):
        s = json.load(open(os.path.join(SCHEMA_DIR, f)))
        _store[s["$id"]] = s
        _store[f] = s


def validate(doc, kind):
    schema = _store[f"{kind}.schema.json"]
    resolver = jsonschema.RefResolver(base_uri=schema["$id"], referrer=schema, store=_store)
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema, resolver=resolver).iter_errors(doc))
    return None if error is None else f"{kind} document: {error.message} at {list(error.absolute_path)}"


def validate_file(path, kind):
    return validate(json.load(open(path)), kind)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from checks import Checks

    PTOOL, ROOT = sys.argv[1], sys.argv[2]
    check = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        docs = {}
        runs = {
            "verify": ["verify", f"{ROOT}/models/mlp.yaml", f"{ROOT}/plans/mlp_colwise_replicate.yaml", "-q"],
            "explain": ["explain", f"{ROOT}/models/llama_rope.yaml", f"{ROOT}/plans/llama_rope_fsdp_tp_ac.yaml",
                        "--cluster", f"{ROOT}/clusters/h100_8x8.yaml"],
            "plan": ["plan", f"{ROOT}/models/llama_rope.yaml", "--cluster", f"{ROOT}/clusters/cpu_local.yaml", "--world-size", "2"],
            "golden_cases": ["verify", f"{ROOT}/golden/mlp_root_module.safetensors", "-q"],
        }
        for kind, args in runs.items():
            out = os.path.join(tmp, f"{kind}.json")
            p = subprocess.run([PTOOL, *args, "--json", out], capture_output=True, text=True, timeout=300)
            if not check(p.returncode == 0 and os.path.exists(out), f"{kind}: exit {p.returncode}\n{p.stdout}{p.stderr}"):
                continue
            docs[kind] = json.load(open(out))
            err = validate(docs[kind], kind)
            check(err is None, f"{kind}: a fresh document fails its schema: {err}")
            check(docs[kind]["schema_version"] == 1 and docs[kind]["kind"] == kind, f"{kind}: header {docs[kind].get('kind')}")
        # a failing verify: the divergence is structured
        out = os.path.join(tmp, "fail.json")
        p = subprocess.run([PTOOL, "verify", f"{ROOT}/models/mlp.yaml", f"{ROOT}/plans/mlp_colwise_replicate.yaml", "-q",
                            "--json", out], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PTOOL_FAULT="wrong_shard_offset:net1"))
        if check(p.returncode == 1 and os.path.exists(out), f"failing verify: exit {p.returncode}\n{p.stdout}{p.stderr}"):
            doc = json.load(open(out))
            check(validate(doc, "verify") is None, f"failing verify: {validate(doc, 'verify')}")
            d = doc["plans"][0]["divergence"]
            check(d is not None and d["at"] == {"step": 0, "kind": "forward", "fqn": "net1"},
                  f"structured divergence: {d}")
        # verify --golden: the case's three comparisons are the document's plans
        out = os.path.join(tmp, "three_way.json")
        p = subprocess.run([PTOOL, "verify", f"{ROOT}/models/mlp.yaml", f"{ROOT}/plans/mlp_root_module.yaml", "-q", "--golden",
                            f"{ROOT}/golden/mlp_root_module.safetensors", "--json", out], capture_output=True, text=True, timeout=300)
        if check(p.returncode == 0 and os.path.exists(out), f"verify --golden --json: exit {p.returncode}\n{p.stdout}{p.stderr}"):
            doc = json.load(open(out))
            check(validate(doc, "verify") is None, f"verify --golden: {validate(doc, 'verify')}")
            check(len(doc["plans"]) == 3, f"verify --golden: {len(doc['plans'])} plans")
        # a golden replay with a refused case (float8 under float16): its document lists it, REFUSED
        out = os.path.join(tmp, "refused.json")
        p = subprocess.run([PTOOL, "verify", f"{ROOT}/golden/float8_llama_rope_ddp_float8_rowwise.safetensors",
                            f"{ROOT}/golden/mlp_root_module.safetensors", "--dtype", "float16", "-q", "--json", out],
                           capture_output=True, text=True, timeout=300)
        if check(p.returncode == 2 and os.path.exists(out), f"a refused golden case: exit {p.returncode}\n{p.stdout}{p.stderr}"):
            doc = json.load(open(out))
            check(validate(doc, "golden_cases") is None, f"a refused golden case: {validate(doc, 'golden_cases')}")
            check([c["verdict"] for c in doc["cases"]][0] == "REFUSED" and "float16" in doc["cases"][0]["detail"],
                  f"a refused golden case: {doc['cases'][:1]}")
        # the validator refuses what it should
        if "verify" in docs:
            for what, mutate in [
                ("no schema_version", lambda d: d.pop("schema_version")),
                ("schema_version 2", lambda d: d.update(schema_version=2)),
                ("pass as a string", lambda d: d.update({"pass": "yes"})),
                ("a tensor without id", lambda d: d["plans"][0]["tensors"][0].pop("id")),
                ("an id with a stray field", lambda d: d["plans"][0]["tensors"][0]["id"].update(x=1)),
                ("an unknown replica state", lambda d: d["plans"][0]["tensors"][0].update(replicas="maybe")),
            ]:
                bad = copy.deepcopy(docs["verify"])
                mutate(bad)
                check(validate(bad, "verify") is not None, f"the verify schema accepts a document with {what}")
        if "explain" in docs:
            bad = copy.deepcopy(docs["explain"])
            bad.pop("parameters")
            check(validate(bad, "explain") is not None, "the explain schema accepts a document without 'parameters'")
            for what, mutate in [("no first_step_peak_bytes", lambda d: d["memory"][0].pop("first_step_peak_bytes")),
                                 ("no simulated_steps", lambda d: d.pop("simulated_steps")),
                                 ("one simulated step", lambda d: d.update(simulated_steps=1))]:
                bad = copy.deepcopy(docs["explain"])
                mutate(bad)
                check(validate(bad, "explain") is not None, f"the explain schema accepts a document with {what}")
    check.finish()
