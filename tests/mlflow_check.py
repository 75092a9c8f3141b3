"""tracking.mlflow against a real MLflow tracking server.

Usage: mlflow_check.py TRAINER_BINARY SOURCE_DIR

Starts `mlflow server` (sqlite backend, artifacts served, a free port on 127.0.0.1) and checks,
reading the runs back with MLflow's Python client:
  1. a run of configs/synthetic.yaml: every metric of metrics.jsonl (tag names as TensorBoard's,
     the same steps and values), the resolved config as params, the system and config tags
     (mlflow.user as getpass.getuser() names it, trainer.last_checkpoint absolute),
     config.yaml as an artifact, status FINISHED;
  2. a run stopped halfway (status KILLED) and resumed continues the same MLflow run, which then
     holds every record of metrics.jsonl once;
  3. the server unreachable while a run trains (a gate in front of it shut until the run warns,
     and a second more) and reachable again: the run is not slowed by more than 10% against the
     same run tracked through the open gate (in one of up to 3 such pairs: single runs on a
     shared machine move by more), it says that the server answers again, and the records
     logged meanwhile arrive;
  4. a run killed (SIGKILL) after MLflow got steps past its last checkpoint and resumed with
     --resume auto: the MLflow run's history has each step of metrics.jsonl once;
  5. a server that answers 400 (MLflow's error JSON): the run's last warning names the
     rejection and the server's message, not "not reachable"; one that answers 200 with a web
     page: a warning that it is not MLflow's reply, and never "answers again";
  6. a server that accepts connections and never answers: SIGTERM to `trainer launch` ends the
     job within the launcher's grace period, exit 0.
Exits 77 (skipped) when mlflow is not installed.
"""
import getpass
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml
from run_check import report

# Nothing leaves the machine: no usage telemetry from the server or the client.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DO_NOT_TRACK"] = "true"

try:
    import mlflow  # noqa: F401
    from mlflow.tracking import MlflowClient
except ImportError:
    print("mlflow is not installed in this Python; skipping")
    sys.exit(77)


# On two or more cores the server runs on the last and the timed trainer runs on the first, so
# that the server's restart (a Python start-up) does not take the training's core.
CPUS = os.cpu_count() or 1
SERVER_CPU = (lambda: os.sched_setaffinity(0, {CPUS - 1})) if CPUS >= 2 else None
TRAINER_CPU = (lambda: os.sched_setaffinity(0, {0})) if CPUS >= 2 else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` on a port, started and stopped at will."""

    def __init__(self, folder, port):
        self.folder, self.port, self.proc = folder, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self, timeout=120):
        db = os.path.join(self.folder, "mlflow.db")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination",
             os.path.join(self.folder, "artifacts"), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.folder, "server.log"), "a"),
            start_new_session=True,  # its workers in its process group, stopped with it
            preexec_fn=SERVER_CPU,
            # No job runner (a third Python process, for GenAI jobs): tracking does not use it.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.time() + timeout
        while time.time() < deadline:  # until it answers
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("mlflow server did not answer")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc:  # its workers too
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def train(trainer, source, run_dir, uri, *sets, resume=False, check=True, pin=None):
    args = [trainer, "--config", os.path.join(source, "configs/synthetic.yaml"), "--run-dir",
            run_dir, "--log-level", "info"]
    if uri:
        args += ["--set", f"tracking.mlflow.uri={uri}", "--set", "tracking.mlflow.experiment=ci",
                 "--set", "tracking.mlflow.tags=team=ci,purpose=check"]
    for s in sets:
        args += ["--set", s]
    if resume:
        args += ["--resume", "auto"]
    return subprocess.run(args, capture_output=True, text=True, check=check, preexec_fn=pin)


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def expected_metrics(run_dir):
    out = {}
    for r in records(run_dir):
        for key, value in r.items():
            if key in ("split", "step", "epoch") or not isinstance(value, (int, float)):
                continue
            name = key if key == "lr" else f"{r['split']}/{key}"
            out.setdefault(name, []).append((r["step"], float(value)))
    return out


def compare_metrics(client, run_id, run_dir, failures, label, skip_values=()):
    """MLflow's history of each metric has the steps and values of metrics.jsonl (the steps only
    for the keys in `skip_values`)."""
    want = expected_metrics(run_dir)
    got_keys = set(client.get_run(run_id).data.metrics)
    if got_keys != set(want):
        failures.append(f"{label}: metric names {sorted(got_keys)}, metrics.jsonl {sorted(want)}")
    for key, points in want.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        if [s for s, _ in history] != [s for s, _ in sorted(points)] or (
                key not in skip_values and any(
                    abs(a - b) > 1e-9 * max(1.0, abs(b))
                    for (_, a), (_, b) in zip(history, sorted(points)))):
            failures.append(f"{label}: {key}: MLflow has {len(history)} points, metrics.jsonl "
                            f"{len(points)}; first differences {history[:2]} vs {points[:2]}")
            return


def check_run(client, trainer, source, tmp, uri, failures):
    run_dir = os.path.join(tmp, "plain")
    train(trainer, source, run_dir, uri, "run.log_every=1")
    run_id = open(os.path.join(run_dir, "mlflow_run_id")).read().strip()
    run = client.get_run(run_id)
    compare_metrics(client, run_id, run_dir, failures, "plain run")
    if run.info.status != "FINISHED":
        failures.append(f"plain run: status {run.info.status}")
    flat = subprocess.run([trainer, "--config", os.path.join(run_dir, "config.yaml"),
                           "--print-config"], capture_output=True, text=True, check=True).stdout
    config = yaml.safe_load(flat)
    if run.data.params.get("optim.lr") != str(config["optim"]["lr"]) or \
            run.data.params.get("model.name") != "mlp" or len(run.data.params) < 50:
        failures.append(f"plain run: params {dict(list(run.data.params.items())[:5])}... "
                        f"({len(run.data.params)})")
    tags = run.data.tags
    for key in ("trainer.version", "trainer.libtorch", "trainer.host", "trainer.run_dir",
                "trainer.last_checkpoint", "mlflow.source.name"):
        if not tags.get(key):
            failures.append(f"plain run: no tag {key}")
    # The user as MLflow's own client names it; the checkpoint as a path usable from anywhere.
    if tags.get("mlflow.user") != getpass.getuser():
        failures.append(f"plain run: mlflow.user {tags.get('mlflow.user')!r}, "
                        f"getpass.getuser() {getpass.getuser()!r}")
    last = tags.get("trainer.last_checkpoint", "")
    if not os.path.isabs(last) or not os.path.isfile(last):
        failures.append(f"plain run: trainer.last_checkpoint {last!r} is not an absolute path "
                        "to a file")
    if tags.get("team") != "ci" or tags.get("mlflow.runName") != "plain":
        failures.append(f"plain run: tags team={tags.get('team')} "
                        f"runName={tags.get('mlflow.runName')}")
    names = [a.path for a in client.list_artifacts(run_id)]
    if "config.yaml" not in names:
        failures.append(f"plain run: artifacts {names}")


def check_resume(client, trainer, source, tmp, uri, failures):
    run_dir = os.path.join(tmp, "resumed")
    train(trainer, source, run_dir, uri, "train.stop_at_step=9")
    first = open(os.path.join(run_dir, "mlflow_run_id")).read().strip()
    if client.get_run(first).info.status != "KILLED":
        failures.append(f"stopped run: status {client.get_run(first).info.status}")
    train(trainer, source, run_dir, uri, "train.stop_at_step=0", resume=True)
    second = open(os.path.join(run_dir, "mlflow_run_id")).read().strip()
    if first != second:
        failures.append(f"the resumed run started another MLflow run ({first} -> {second})")
    compare_metrics(client, first, run_dir, failures, "resumed run")
    if client.get_run(first).info.status != "FINISHED":
        failures.append(f"resumed run: status {client.get_run(first).info.status}")


def loop_seconds(stderr):
    m = re.search(r"done: \d+ steps in ([0-9.]+) s", stderr)
    return float(m.group(1)) if m else float("nan")


class Gate:
    """A TCP forwarder to the server that can be shut and opened again at once: shut, it accepts
    no connection (refused) and drops the open ones, as a server that went away does."""

    def __init__(self, target_port):
        self.target, self.port = target_port, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.lock, self.conns, self.listener = threading.Lock(), [], None
        self.open()

    def open(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def shut(self):
        with self.lock:
            self.listener.close()
            for c in self.conns:
                c.close()
            self.conns = []

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # shut
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for c in (a, b):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def server_down_run(client, server, trainer, source, run_dir, sets, failures):
    """One run tracked through a gate that is shut until the run warns, and a second more, then
    opened: the loop's seconds, or None after a failure (appended to `failures`)."""
    gate = Gate(server.port)
    args = [trainer, "--config", os.path.join(source, "configs/synthetic.yaml"), "--run-dir",
            run_dir, "--log-level", "info", "--set", f"tracking.mlflow.uri={gate.uri}"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=TRAINER_CPU)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    seen = lambda text: any(text in line for line in list(lines))
    id_file = os.path.join(run_dir, "mlflow_run_id")
    wait_for(lambda: os.path.exists(id_file) or proc.poll() is not None, 60, "the MLflow run")
    gate.shut()
    # Shut until the run has noticed, and a second more of records queued meanwhile.
    try:
        wait_for(lambda: seen("retrying in the background") or proc.poll() is not None, 30,
                 "the warning")
    except RuntimeError:
        pass
    noticed = seen("retrying in the background")
    time.sleep(1.0)
    gate.open()
    if proc.poll() is not None:
        failures.append("the run ended before the server was back; nothing was logged after it")
    proc.wait(timeout=300)
    reader.join(timeout=30)
    stderr = "".join(lines)
    if proc.returncode != 0:
        failures.append(f"the run with the server stopped exited {proc.returncode}: "
                        f"{stderr[-500:]}")
        return None
    if not noticed or "answers again" not in stderr:
        failures.append("no warning that the server was unreachable, or none that it came back")
    compare_metrics(client, open(id_file).read().strip(), run_dir, failures, "server down")
    return loop_seconds(stderr)


def check_server_down(client, server, trainer, source, tmp, failures):
    # About 8 s of training on one thread (the server has the other core), 10 records a second,
    # tracked through a gate to the server that is shut for a while (1.5 to 2 s: until the run
    # warns, and a second more) and opened again. A run that waited on the server would be some
    # 20% slower. The same run on this shared machine moves by 25% (its CPU time as much), so
    # one pair of runs cannot tell 10% apart: up to 3 pairs (the base, then the outage) are run,
    # and one within 10% passes. A run that waits on the server is slower in every pair.
    sets = ["run.threads=1", "train.max_steps=8000", "data.train_samples=4096",
            "model.hidden=[512,512]", "run.log_every=100", "run.eval_every=2000",
            "run.checkpoint_every=0", "run.progress=never"]
    pairs = []
    for attempt in range(3):
        gate = Gate(server.port)
        # The base is tracked too: the sending thread shares the training's core in both runs.
        base = loop_seconds(train(trainer, source, os.path.join(tmp, f"base{attempt}"),
                                  gate.uri, *sets, pin=TRAINER_CPU).stderr)
        gate.shut()
        took = server_down_run(client, server, trainer, source,
                               os.path.join(tmp, f"down{attempt}"), sets, failures)
        if took is None:
            return
        pairs.append(f"{took:.2f} s against {base:.2f} s")
        if took <= 1.10 * base:
            break
    print(f"server unreachable for part of the run: loop {'; '.join(pairs)} with it reachable")
    if not took <= 1.10 * base:
        failures.append(f"the run with the server unreachable for a while was more than 10% "
                        f"slower than with it reachable in each of 3 pairs: {'; '.join(pairs)}")


def wait_for(condition, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def check_kill_resume(client, trainer, source, tmp, uri, failures):
    run_dir = os.path.join(tmp, "killed")
    sets = ["run.threads=1", "train.max_steps=4000", "data.train_samples=4096",
            "model.hidden=[512,512]", "run.log_every=10", "run.checkpoint_every=1000",
            "run.progress=never"]
    args = [trainer, "--config", os.path.join(source, "configs/synthetic.yaml"), "--run-dir",
            run_dir, "--log-level", "info", "--set", f"tracking.mlflow.uri={uri}"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    id_file = os.path.join(run_dir, "mlflow_run_id")

    def mlflow_past_checkpoint():  # MLflow holds steps the resume will redo
        if proc.poll() is not None:
            raise RuntimeError("the run ended before it was killed")
        if not os.path.exists(id_file):
            return False
        run_id = open(id_file).read().strip()
        return max((m.step for m in client.get_metric_history(run_id, "train/loss")),
                   default=0) >= 1300
    try:
        wait_for(mlflow_past_checkpoint, 120, "MLflow to hold step 1300")
    finally:
        proc.kill()
        proc.wait()
    r = subprocess.run(args + ["--resume", "auto"], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"resume after kill -9: exit {r.returncode}: {r.stderr[-500:]}")
        return
    resumed = re.search(r"resumed from .* at step (\d+)", r.stderr)
    if not resumed or int(resumed.group(1)) >= 1300 or "not logged to it again" not in r.stderr:
        failures.append("resume after kill -9: not from a checkpoint before the steps MLflow "
                        f"holds (1300 and on): {r.stderr[-800:]}")
    # Redone steps give the same losses (deterministic: true); throughput differs.
    compare_metrics(client, open(id_file).read().strip(), run_dir, failures, "killed and resumed",
                    skip_values=("train/samples_per_sec",))


class FixedReply:
    """A loopback HTTP server answering every request with one status and body."""

    def __init__(self, status, body, content_type):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def check_bad_replies(trainer, source, tmp, failures):
    rejecting = FixedReply(400, b'{"error_code": "INVALID_PARAMETER_VALUE", "message": "Invalid '
                           b'value for the run: refused by this server"}', "application/json")
    page = FixedReply(200, b"<html><body>Sign in</body></html>", "text/html")
    try:
        r = train(trainer, source, os.path.join(tmp, "rejected"), rejecting.uri,
                  "train.stop_at_step=4", check=False)
        last = [line for line in r.stderr.splitlines() if "were not sent" in line]
        if r.returncode != 0 or not last or "rejected" not in last[-1] or \
                "INVALID_PARAMETER_VALUE" not in last[-1] or "refused by this server" not in \
                last[-1] or "not reachable" in last[-1]:
            failures.append(f"a server answering 400: the last warning is {last[-1:]} "
                            f"(exit {r.returncode})")
        r = train(trainer, source, os.path.join(tmp, "page"), page.uri, "train.stop_at_step=4",
                  check=False)
        if r.returncode != 0 or "not MLflow's JSON reply" not in r.stderr or \
                "answers again" in r.stderr:
            failures.append(f"a server answering with a web page: {r.stderr[-600:]}")
    finally:
        rejecting.close()
        page.close()


def check_grace_period(trainer, source, tmp, failures):
    silent = socket.socket()  # connections complete in the backlog; nothing ever answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    run_dir = os.path.join(tmp, "grace")
    args = [trainer, "launch", "--standalone", "--nproc-per-node", "1", "--grace-period", "10",
            "--", "--config", os.path.join(source, "configs/synthetic.yaml"), "--run-dir",
            run_dir, "--set", f"tracking.mlflow.uri=http://127.0.0.1:{silent.getsockname()[1]}",
            "--set", "train.max_steps=100000000", "--set", "run.log_every=1", "--set",
            "run.progress=never"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        metrics = os.path.join(run_dir, "metrics.jsonl")
        wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0, 120,
                 "the first metrics record")
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        stderr = proc.communicate(timeout=120)[1]
        took = time.time() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        silent.close()
    print(f"SIGTERM to launch with a silent MLflow server: exit {proc.returncode} in {took:.1f} s")
    if proc.returncode != 0 or took >= 10:
        failures.append(f"SIGTERM with a silent MLflow server: launch exited {proc.returncode} "
                        f"after {took:.1f} s (grace period 10 s): {stderr[-600:]}")


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(tmp, free_port())
        server.start()
        try:
            client = MlflowClient(tracking_uri=server.uri)
            check_run(client, trainer, source, tmp, server.uri, failures)
            check_resume(client, trainer, source, tmp, server.uri, failures)
            check_server_down(client, server, trainer, source, tmp, failures)
            check_kill_resume(client, trainer, source, tmp, server.uri, failures)
            check_bad_replies(trainer, source, tmp, failures)
            check_grace_period(trainer, source, tmp, failures)
        finally:
            server.stop()
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
