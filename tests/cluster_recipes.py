#!/usr/bin/env python3
"""What one node of a docker/k8s recipe runs, read from the manifest (not retyped).

    cluster_recipes.py trainjob|volcano MANIFEST NODE [--trainer PATH] [--config FILE]
                       [--run-dir DIR] [--nproc N] [--nodes N] [-- EXTRA...]

prints, NUL-separated, the environment a scheduler gives node NODE's container (VAR=VALUE
entries) followed by the container's command and arguments, ready for `env`:

- trainjob: the TrainJob's spec.trainer.env, and the variables Kubeflow Trainer's torch plugin
  sets in every node's container: PET_NNODES (spec.trainer.numNodes), PET_NPROC_PER_NODE
  (spec.trainer.numProcPerNode), PET_NODE_RANK (the node's Job completion index),
  PET_MASTER_ADDR (<name>-node-0-0.<name>) and PET_MASTER_PORT (29400, the plugin's
  ContainerTrainerPort); the command is spec.trainer.command + spec.trainer.args.
- volcano: the container's env, and what Volcano's pytorch plugin sets in every pod of the tasks
  it names (--master, --worker): MASTER_ADDR (<job>-<master>-0.<job>), MASTER_PORT (--port),
  WORLD_SIZE (the replicas of both tasks) and RANK (master 0, worker pod i: i + 1); the command
  is the task's container's command + args.

The substitutions make it run here: the program `trainer` becomes --trainer, and the values after
--config, --run-dir and --nproc-per-node in the arguments become the ones given (--nproc also
replaces numProcPerNode, --nodes numNodes or the worker replicas); EXTRA is appended.
`cluster_recipes.py hosts trainjob|volcano MANIFEST` prints the master's host name.
"""
import sys

import yaml


def documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(path, kind, api_prefix):
    found = [d for d in documents(path)
             if d.get("kind") == kind and d.get("apiVersion", "").startswith(api_prefix)]
    if len(found) != 1:
        sys.exit(f"{path}: expected one {kind} ({api_prefix}...), found {len(found)}")
    return found[0]


TORCH_PLUGIN_PORT = 29400  # Kubeflow Trainer's constants.ContainerTrainerPort


def trainjob(path, node, opts):
    job = one(path, "TrainJob", "trainer.kubeflow.org/")
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    nodes = opts.get("nodes", trainer["numNodes"])
    env = {e["name"]: e["value"] for e in trainer.get("env", [])}
    env.update({
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(opts.get("nproc", trainer["numProcPerNode"])),
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
        "PET_MASTER_PORT": str(TORCH_PLUGIN_PORT),
    })
    return env, list(trainer["command"]) + list(trainer.get("args", []))


def plugin_flags(args):
    flags = {}
    for a in args:
        key, _, value = a.lstrip("-").partition("=")
        flags[key] = value
    return flags


def volcano(path, node, opts):
    job = one(path, "Job", "batch.volcano.sh/")
    name, spec = job["metadata"]["name"], job["spec"]
    flags = plugin_flags(spec["plugins"]["pytorch"])
    master, worker = flags.get("master", "master"), flags.get("worker", "worker")
    port = flags.get("port", "23456")
    tasks = {t["name"]: t for t in spec["tasks"]}
    replicas = tasks[master]["replicas"] + tasks[worker]["replicas"]
    world = opts.get("nodes", replicas)
    task = tasks[master] if node == 0 else tasks[worker]
    container = task["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    env.update({
        "MASTER_ADDR": f"{name}-{master}-0.{name}",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "RANK": str(node),
    })
    return env, list(container["command"]) + list(container.get("args", []))


def substitute(argv, opts, extra):
    out = list(argv)
    if out[0] == "trainer" and "trainer" in opts:
        out[0] = opts["trainer"]
    flags = {"--config": "config", "--run-dir": "run_dir", "--nproc-per-node": "nproc"}
    for i in range(len(out) - 1):
        key = flags.get(out[i])
        if key and key in opts:
            out[i + 1] = str(opts[key])
    return out + extra


def main(argv):
    if argv[:1] == ["hosts"]:
        env, _ = (trainjob if argv[1] == "trainjob" else volcano)(argv[2], 0, {})
        print(env.get("PET_MASTER_ADDR") or env["MASTER_ADDR"])
        return
    kind, path, node = argv[0], argv[1], int(argv[2])
    rest, extra = argv[3:], []
    if "--" in rest:
        extra = rest[rest.index("--") + 1:]
        rest = rest[:rest.index("--")]
    opts = {}
    for key, value in zip(rest[::2], rest[1::2]):
        name = key.lstrip("-").replace("-", "_")
        opts[name] = int(value) if name in ("nproc", "nodes") else value
    env, command = {"trainjob": trainjob, "volcano": volcano}[kind](path, node, opts)
    out = [f"{k}={v}" for k, v in env.items()] + substitute(command, opts, extra)
    sys.stdout.write("\0".join(out) + "\0")


if __name__ == "__main__":
    main(sys.argv[1:])
