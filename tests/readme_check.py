#!/usr/bin/env python3
"""The README's torchvision block, run as printed (CTest Readme.TorchvisionSnippetRuns).

  readme_check.py TRAINER REPO

Takes the fenced block of README.md that starts with `trainer export --checkpoint runs/c`, and
runs it with bash in a scratch folder that holds what the block assumes: runs/c (a resnet50 run
of one step on generated 5-class data), c.yaml (its config) and .venv (the repository's). `trainer`
in the block is the binary under test. The block must exit 0: the export loads into torchvision's
resnet50 with the class count from the export's metadata, and training starts from the export.
Exits 77 (skipped) without torchvision or safetensors in the venv.
"""
import os
import re
import subprocess
import sys
import tempfile

CONFIG = """base: {repo}/configs/synthetic.yaml
model: {{name: resnet50}}
data: {{shape: [3, 32, 32], num_classes: 5, batch_size: 2, train_samples: 4, val_samples: 2}}
train: {{max_steps: 1}}
run: {{dir: runs/c, overwrite: true}}
"""


def block(readme):
    for match in re.finditer(r"```sh\n(.*?)```", readme, re.S):
        if match.group(1).startswith("trainer export --checkpoint runs/c "):
            return match.group(1)
    sys.exit("README.md has no ```sh block starting with `trainer export --checkpoint runs/c`")


def main():
    trainer, repo = sys.argv[1], sys.argv[2]
    venv_python = os.path.join(repo, ".venv", "bin", "python")
    probe = subprocess.run([venv_python, "-c", "import torchvision, safetensors"],
                           capture_output=True)
    if probe.returncode != 0:
        print("skipped: no torchvision or safetensors in .venv")
        sys.exit(77)
    script = block(open(os.path.join(repo, "README.md")).read())
    with tempfile.TemporaryDirectory() as work:
        os.symlink(os.path.join(repo, ".venv"), os.path.join(work, ".venv"))
        with open(os.path.join(work, "c.yaml"), "w") as f:
            f.write(CONFIG.format(repo=repo))
        subprocess.run([trainer, "--config", "c.yaml", "--log-level", "warn"], cwd=work,
                       check=True)
        prelude = f'set -euo pipefail\ntrainer() {{ "{trainer}" "$@"; }}\n'
        # The last line trains again from the export, into the same run dir.
        run = subprocess.run(["bash", "-c", prelude + script], cwd=work, capture_output=True,
                             text=True)
        if run.returncode != 0:
            sys.exit(f"the README block failed ({run.returncode}):\n{script}\n{run.stdout}\n"
                     f"{run.stderr}")
        if "initialised from resnet50.safetensors" not in run.stderr + run.stdout:
            sys.exit(f"training did not start from the export:\n{run.stderr}")
        print("the README's torchvision block ran as printed")


if __name__ == "__main__":
    main()
