#!/usr/bin/env python3
"""docker/k8s's manifests against the CRDs' schemas (CTest Cluster.ManifestsMatchCRDSchemas).

    cluster_manifests_check.py SOURCE_DIR

Every custom resource in docker/k8s/*.yaml is validated against the openAPIV3Schema of its CRD in
tests/data/crds (trimmed upstream copies, see the README there) with the jsonschema package, as
`kubectl apply` with strict field validation checks it: an object's fields must be among its
schema's properties unless the schema allows others. Then what makes the recipes work beyond
the schema: the TrainJob names the shipped runtime, whose replicated Job and container are both
named `node` with the ancestor label (the torch plugin sets PET_* only there); the Volcano tasks
are those the pytorch plugin names; the volumes name claims the file creates, and the run
directory lies on the shared claim. Each check is also run on a broken copy, which must fail.
Exits 77 (skipped) without jsonschema or PyYAML.
"""
import copy
import glob
import os
import sys

try:
    import jsonschema
    import yaml
except ImportError as e:
    print(f"skipped: {e.name} is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

FAILURES = []


def fail(message):
    FAILURES.append(message)
    print("FAIL:", message)


def strict(schema):
    """The schema with additionalProperties false wherever Kubernetes prunes or rejects unknown
    fields: objects with properties, without additionalProperties or preserve-unknown-fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def load_crds(directory):
    """{(group, version, kind): validator} for every CRD file in directory."""
    validators = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        for crd in yaml.safe_load_all(open(path)):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                schema = strict(version["schema"]["openAPIV3Schema"])
                jsonschema.Draft7Validator.check_schema(schema)
                key = (spec["group"], version["name"], spec["names"]["kind"])
                validators[key] = jsonschema.Draft7Validator(schema)
    return validators


def errors(validators, doc):
    """The schema errors of doc as 'path: message' lines; None when no CRD covers it."""
    group, _, version = doc["apiVersion"].rpartition("/")
    validator = validators.get((group, version, doc["kind"]))
    if validator is None:
        return None
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in validator.iter_errors(doc)]


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def pod_specs(doc):
    """(where, pod spec) of a runtime's replicated Jobs or a Volcano Job's tasks."""
    if doc["kind"] == "ClusterTrainingRuntime":
        for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
            yield f"replicatedJob {job['name']}", job["template"]["spec"]["template"]["spec"]
    elif doc["kind"] == "Job":
        for task in doc["spec"]["tasks"]:
            yield f"task {task['name']}", task["template"]["spec"]


def claims_and_run_dir(docs, doc, args):
    """Problems: volumes naming claims the file does not create; a --run-dir not on the claim
    trainer-runs' mount."""
    problems = []
    made = {d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")}
    run_dir = args[args.index("--run-dir") + 1] if "--run-dir" in args else None
    for where, pod in pod_specs(doc):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
        for name, claim in claims.items():
            if claim not in made:
                problems.append(f"{where}: volume {name} names claim {claim}, which the file does not create")
        mounts = [(m["mountPath"], claims.get(m["name"])) for c in pod["containers"]
                  for m in c.get("volumeMounts", [])]
        shared = [path for path, claim in mounts if claim == "trainer-runs"]
        if run_dir and not any(run_dir.startswith(path.rstrip("/") + "/") for path in shared):
            problems.append(f"{where}: --run-dir {run_dir} is not under the mount of claim trainer-runs ({shared})")
    return problems


def trainjob_problems(docs):
    problems = []
    jobs, runtimes = by_kind(docs, "TrainJob"), by_kind(docs, "ClusterTrainingRuntime")
    for job in jobs:
        ref = job["spec"]["runtimeRef"]["name"]
        named = [r for r in runtimes if r["metadata"]["name"] == ref]
        if not named:
            problems.append(f"TrainJob {job['metadata']['name']}: runtimeRef {ref} is not in the file")
            continue
        runtime = named[0]
        if "torch" not in runtime["spec"].get("mlPolicy", {}):
            problems.append(f"ClusterTrainingRuntime {ref}: no mlPolicy.torch, so no PET_* variables")
        nodes = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node"]
        if not nodes:
            problems.append(f"ClusterTrainingRuntime {ref}: no replicated Job named node")
        for node in nodes:
            labels = node["template"].get("metadata", {}).get("labels", {})
            if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
                problems.append(f"ClusterTrainingRuntime {ref}: replicated Job node lacks the label "
                                "trainer.kubeflow.org/trainjob-ancestor-step: trainer")
            names = [c["name"] for c in node["template"]["spec"]["template"]["spec"]["containers"]]
            if "node" not in names:
                problems.append(f"ClusterTrainingRuntime {ref}: replicated Job node has no container "
                                f"named node (has {names}): the torch plugin sets PET_* only there")
        trainer = job["spec"]["trainer"]
        command = trainer.get("command", []) + trainer.get("args", [])
        if command[:2] != ["trainer", "launch"] or "--resume" not in command:
            problems.append(f"TrainJob {job['metadata']['name']}: the command is not trainer launch ... --resume")
        problems += claims_and_run_dir(docs, runtime, command)
    return problems


def volcano_problems(docs):
    problems = []
    for job in by_kind(docs, "Job"):
        spec = job["spec"]
        flags = dict(a.lstrip("-").partition("=")[::2] for a in spec.get("plugins", {}).get("pytorch", []))
        if "pytorch" not in spec.get("plugins", {}) or "svc" not in spec["plugins"]:
            problems.append("Volcano Job: the pytorch and svc plugins set the nodes' layout and host names")
        tasks = {t["name"] for t in spec["tasks"]}
        for role in (flags.get("master", "master"), flags.get("worker", "worker")):
            if role not in tasks:
                problems.append(f"Volcano Job: the pytorch plugin's task {role} is not among the tasks {sorted(tasks)}")
        for where, pod in pod_specs(job):
            container = pod["containers"][0]
            command = container.get("command", []) + container.get("args", [])
            if command[:2] != ["trainer", "launch"] or "--resume" not in command:
                problems.append(f"Volcano Job {where}: the command is not trainer launch ... --resume")
            problems += claims_and_run_dir(docs, job, command)
    return problems


def check_file(validators, path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    for doc in docs:
        name = f"{os.path.basename(path)}: {doc['kind']} {doc['metadata']['name']}"
        found = errors(validators, doc)
        if found is None:
            if "." in doc["apiVersion"].split("/")[0]:
                fail(f"{name}: no CRD for {doc['apiVersion']} in tests/data/crds")
            else:
                print(f"{name}: a core kind ({doc['apiVersion']}), no CRD to check")
            continue
        print(f"{name}: {'valid' if not found else 'INVALID'} against its CRD's schema")
        for line in found:
            fail(f"{name}: {line}")
    for line in trainjob_problems(docs) + volcano_problems(docs):
        fail(f"{os.path.basename(path)}: {line}")
    return docs


def mutated(doc, change):
    out = copy.deepcopy(doc)
    change(out)
    return out


def first_pod(doc):
    return next(pod_specs(doc))[1]


def rename(d, old, new):
    d[new] = d.pop(old)


# Broken copies, each with the field the error must name.
BROKEN = {
    "TrainJob": [
        ("a misspelt field", lambda d: rename(d["spec"]["trainer"], "numNodes", "numNode"), "numNode"),
        ("a string process count", lambda d: d["spec"]["trainer"].update(numProcPerNode="eight"), "numProcPerNode"),
        ("no runtimeRef", lambda d: d["spec"].pop("runtimeRef"), "runtimeRef"),
        ("a GPU count that is not a quantity", lambda d: d["spec"]["trainer"]["resourcesPerNode"]["limits"].update({"nvidia.com/gpu": "8 GPUs"}), "nvidia.com/gpu"),
    ],
    "ClusterTrainingRuntime": [
        ("an unknown restart strategy", lambda d: d["spec"]["template"]["spec"]["failurePolicy"].update(restartStrategy="Sometimes"), "restartStrategy"),
        ("a claim without its name", lambda d: first_pod(d)["volumes"][0]["persistentVolumeClaim"].pop("claimName"), "claimName"),
        ("a mount without its path", lambda d: first_pod(d)["containers"][0]["volumeMounts"][0].pop("mountPath"), "mountPath"),
    ],
    "Job": [
        ("an event Volcano does not know", lambda d: d["spec"]["policies"][0].update(event="PodLost"), "event"),
        ("no tasks", lambda d: d["spec"].update(tasks=[]), "tasks"),
        ("a container without a name", lambda d: first_pod(d)["containers"][0].pop("name"), "name"),
        ("a misspelt pod field", lambda d: rename(first_pod(d), "restartPolicy", "restartPolcy"), "restartPolcy"),
    ],
}


def check_broken(validators, docs):
    for doc in docs:
        for what, change, field in BROKEN.get(doc["kind"], []):
            found = errors(validators, mutated(doc, change)) or []
            named = [line for line in found if field in line]
            print(f"  broken {doc['kind']} ({what}): {'rejected: ' + named[0] if named else 'ACCEPTED'}")
            if not named:
                fail(f"{doc['kind']} with {what} passed the schema check: {found}")
    # The recipe checks on broken copies.
    for kind, change, check, what in [
        ("ClusterTrainingRuntime", lambda d: first_pod(d)["containers"][0].update(name="trainer"), trainjob_problems, "container not named node"),
        ("TrainJob", lambda d: d["spec"]["runtimeRef"].update(name="torch-distributed"), trainjob_problems, "runtime not in the file"),
        ("ClusterTrainingRuntime", lambda d: first_pod(d)["volumes"][0]["persistentVolumeClaim"].update(claimName="runs"), trainjob_problems, "claim the file does not create"),
        ("Job", lambda d: d["spec"]["tasks"][1].update(name="workers"), volcano_problems, "task the plugin does not name"),
    ]:
        if not by_kind(docs, kind):
            continue
        broken = [mutated(d, change) if d["kind"] == kind else d for d in docs]
        found = check(broken)
        print(f"  broken recipe ({what}): {'rejected: ' + found[0] if found else 'ACCEPTED'}")
        if not found:
            fail(f"a recipe with a {what} passed")


def main(source):
    validators = load_crds(os.path.join(source, "tests", "data", "crds"))
    print(f"{len(validators)} CRD schemas: " + ", ".join(f"{g}/{v} {k}" for g, v, k in sorted(validators)))
    manifests = sorted(glob.glob(os.path.join(source, "docker", "k8s", "*.yaml")))
    if not manifests:
        fail("no manifests in docker/k8s")
    for path in manifests:
        check_broken(validators, check_file(validators, path))
    if FAILURES:
        print(f"{len(FAILURES)} failures")
        sys.exit(1)
    print("every manifest matches its CRD's schema")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
