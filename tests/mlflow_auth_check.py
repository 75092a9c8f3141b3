"""MLflow's credentials: sent as MLflow's own client sends them, never shown or stored.

Usage: mlflow_auth_check.py TRAINER_BINARY SOURCE_DIR

Starts `mlflow server` on 127.0.0.1 and, in front of it, a proxy on 127.0.0.1 that answers 401
to a request without an accepted Authorization header (HTTP basic alice:<uri password>,
alice:<second password> or bob:<environment password>, or Bearer <token>) and forwards the
others. Then checks:
  1. a run with the password in tracking.mlflow.uri logs through the proxy, and neither its
     console output, nor any file of its run dir (train.log, config.yaml, the checkpoints'
     metadata, ...), nor what reached the server (the request bodies, the params, the tags, the
     config.yaml artifact, the server's database and artifact store) holds the password;
     config.yaml, the param and the checkpoints hold the masked URI;
  2. resumed under another host name, the "changed" line shows both URIs masked; resumed with
     only another password, no such line; resumed from the run dir's config.yaml (which holds the
     masked URI) with MLFLOW_TRACKING_USERNAME/PASSWORD, it continues the same MLflow run, which
     then holds every record of metrics.jsonl;
  3. MLFLOW_TRACKING_TOKEN (Bearer) and MLFLOW_TRACKING_USERNAME/PASSWORD (basic) each log every
     metric; without credentials the run trains on, says the server wants them, and sends none;
  4. over https with a self-signed certificate: MLFLOW_TRACKING_SERVER_CERT_PATH and
     MLFLOW_TRACKING_INSECURE_TLS=true each log every metric; with neither, nothing is sent.
No secret appears in any output of any run. Exits 77 (skipped) when mlflow is not installed.
"""
import base64
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mlflow_check import Server, compare_metrics, free_port  # exits 77 without mlflow
from mlflow.tracking import MlflowClient
from run_check import report


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class AuthProxy:
    """Loopback HTTP(S) proxy to `upstream` that refuses requests without an accepted
    Authorization header (401, as MLflow's basic-auth app does) and records every request."""

    def __init__(self, upstream, accepted, tls=None):
        self.upstream, self.accepted = upstream, set(accepted)
        self.lock = threading.Lock()
        self.requests = []  # (authorized, path + body) of each request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                ok = self.headers.get("Authorization") in proxy.accepted
                with proxy.lock:
                    proxy.requests.append((ok, self.path.encode() + b" " + body))
                if not ok:
                    self.reply(401, b'{"error_code": "UNAUTHENTICATED", "message": "You are '
                               b'not authenticated."}', {"WWW-Authenticate": 'Basic realm="mlflow"'})
                    return
                request = urllib.request.Request(proxy.upstream + self.path, method=self.command,
                                                 data=body if self.command != "GET" else None)
                if self.headers.get("Content-Type"):
                    request.add_header("Content-Type", self.headers["Content-Type"])
                try:
                    with urllib.request.urlopen(request, timeout=60) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.reply(status, data)

            do_POST = do_PUT = do_GET

            def reply(self, status, data, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except BrokenPipeError:  # the client gave up waiting
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def counts(self):
        with self.lock:
            return (sum(1 for ok, _ in self.requests if ok),
                    sum(1 for ok, _ in self.requests if not ok))

    def received(self):
        with self.lock:
            return b"\n".join(body for _, body in self.requests)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Checker:
    def __init__(self, trainer, source, tmp, client, failures):
        self.trainer, self.source, self.tmp = trainer, source, tmp
        self.client, self.failures = client, failures
        self.outputs = []  # every run's stdout and stderr

    def train(self, run_dir, uri, *sets, env=None, resume=False, config=None):
        args = [self.trainer, "--config", config or os.path.join(self.source,
                                                                 "configs/synthetic.yaml"),
                "--run-dir", run_dir, "--log-level", "info", "--set", "run.checkpoint_every=8",
                "--set", "tracking.mlflow.experiment=auth"]
        if uri:
            args += ["--set", f"tracking.mlflow.uri={uri}"]
        for s in sets:
            args += ["--set", s]
        if resume:
            args += ["--resume", "auto"]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}
        full_env.update(env or {})
        r = subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=300)
        self.outputs.append(r.stdout + r.stderr)
        if r.returncode != 0:
            self.failures.append(f"{run_dir}: exit {r.returncode}: {r.stderr[-800:]}")
        return r

    def run_id(self, run_dir):
        path = os.path.join(run_dir, "mlflow_run_id")
        return open(path).read().strip() if os.path.exists(path) else ""

    def expect_logged(self, run_dir, label):
        run_id = self.run_id(run_dir)
        if not run_id:
            self.failures.append(f"{label}: no MLflow run was made")
            return ""
        compare_metrics(self.client, run_id, run_dir, self.failures, label)
        status = self.client.get_run(run_id).info.status
        if status != "FINISHED":
            self.failures.append(f"{label}: status {status}")
        return run_id

    def expect_secret_kept(self, secret, label, folders=()):
        """No run output and no file under `folders` holds `secret`."""
        needle = secret.encode()
        for i, text in enumerate(self.outputs):
            if secret in text:
                self.failures.append(f"{label}: the output of run {i + 1} shows the secret")
        for folder in folders:
            for root, _, files in os.walk(folder):
                for name in files:
                    with open(os.path.join(root, name), "rb") as f:
                        if needle in f.read():
                            self.failures.append(f"{label}: {os.path.join(root, name)} holds it")


def check_uri_credentials(c, proxy, server_folder, password, password2):
    """Cases 1 and 2: the password in the URI."""
    run_dir = os.path.join(c.tmp, "uri")
    host = f"127.0.0.1:{proxy.port}"
    masked = f"http://alice:***@{host}"
    c.train(run_dir, f"http://alice:{password}@{host}", "train.stop_at_step=8")
    config_yaml = open(os.path.join(run_dir, "config.yaml")).read()
    if masked not in config_yaml:
        c.failures.append(f"config.yaml does not hold the masked URI {masked}")
    checkpoint = os.path.join(run_dir, "checkpoints", "step_00000008.safetensors")
    if not os.path.exists(checkpoint) or masked.encode() not in open(checkpoint, "rb").read():
        c.failures.append(f"{checkpoint}: no masked URI in its metadata")
    first = c.run_id(run_dir)
    # Another host name: the line that says so shows both masked.
    r = c.train(run_dir, f"http://alice:{password}@localhost:{proxy.port}",
                "train.stop_at_step=16", resume=True)
    want = f"tracking.mlflow.uri changed: {masked} -> http://alice:***@localhost:{proxy.port}"
    if want not in r.stderr:
        c.failures.append(f"resumed under another host: no line '{want}'")
    # Only the password changed: the masked URIs are equal, nothing to say.
    r = c.train(run_dir, f"http://alice:{password2}@localhost:{proxy.port}",
                "train.stop_at_step=24", resume=True)
    if "tracking.mlflow.uri changed" in r.stderr:
        c.failures.append("a resume with only another password says the URI changed")
    # From the run dir's config.yaml, whose URI is masked: the credentials from the environment.
    r = c.train(run_dir, "", "train.stop_at_step=0", resume=True,
                config=os.path.join(run_dir, "config.yaml"),
                env={"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": password})
    run_id = c.expect_logged(run_dir, "password in the URI")
    if run_id and run_id != first:
        c.failures.append(f"the resumes started another MLflow run ({first} -> {run_id})")
    if not run_id:
        return
    run = c.client.get_run(run_id)
    if run.data.params.get("tracking.mlflow.uri") != masked:
        c.failures.append(f"param tracking.mlflow.uri is "
                          f"{run.data.params.get('tracking.mlflow.uri', '')[:12]}..., not masked")
    values = list(run.data.params.values()) + list(run.data.tags.values())
    if any(password in v for v in values):
        c.failures.append("a param or tag of the MLflow run holds the password")
    artifact = c.client.download_artifacts(run_id, "config.yaml", os.path.join(c.tmp, "art"))
    text = open(artifact).read()
    if password in text or masked not in text:
        c.failures.append("the config.yaml artifact holds the password, or not the masked URI")
    if password.encode() in proxy.received():
        c.failures.append("a request body sent to the server holds the password")
    c.expect_secret_kept(password, "password in the URI", [run_dir, server_folder])


def check_env_credentials(c, proxy, token, env_password):
    """Case 3: MLflow's environment variables."""
    uri = f"http://127.0.0.1:{proxy.port}"
    c.train(os.path.join(c.tmp, "token"), uri, env={"MLFLOW_TRACKING_TOKEN": token})
    c.expect_logged(os.path.join(c.tmp, "token"), "MLFLOW_TRACKING_TOKEN")
    c.train(os.path.join(c.tmp, "basic"), uri,
            env={"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": env_password})
    c.expect_logged(os.path.join(c.tmp, "basic"), "MLFLOW_TRACKING_USERNAME/PASSWORD")
    before = proxy.counts()
    r = c.train(os.path.join(c.tmp, "none"), uri, "train.stop_at_step=4")
    after = proxy.counts()
    if c.run_id(os.path.join(c.tmp, "none")) or after[0] != before[0] or after[1] == before[1]:
        c.failures.append(f"without credentials: requests (authorized, refused) went from "
                          f"{before} to {after}")
    if "HTTP 401" not in r.stderr or "MLFLOW_TRACKING_TOKEN" not in r.stderr:
        c.failures.append(f"without credentials, no warning naming the 401 and what to set: "
                          f"{r.stderr[-600:]}")
    for secret in (token, env_password):
        c.expect_secret_kept(secret, "environment credentials",
                             [os.path.join(c.tmp, d) for d in ("token", "basic", "none")])
    if token.encode() in proxy.received() or env_password.encode() in proxy.received():
        c.failures.append("a request body sent to the server holds a credential")


def self_signed(folder):
    """A certificate for 127.0.0.1 and its key, made by openssl; None without openssl."""
    openssl = shutil.which("openssl")
    if not openssl:
        return None
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def check_tls(c, upstream, token):
    """Case 4: https with a certificate the system does not trust."""
    pair = self_signed(c.tmp)
    if not pair:
        print("openssl not found: the https part is skipped")
        return
    proxy = AuthProxy(upstream, [f"Bearer {token}"], tls=pair)
    try:
        uri = f"https://127.0.0.1:{proxy.port}"
        auth = {"MLFLOW_TRACKING_TOKEN": token}
        c.train(os.path.join(c.tmp, "ca"), uri,
                env={**auth, "MLFLOW_TRACKING_SERVER_CERT_PATH": pair[0]})
        c.expect_logged(os.path.join(c.tmp, "ca"), "MLFLOW_TRACKING_SERVER_CERT_PATH")
        c.train(os.path.join(c.tmp, "insecure"), uri,
                env={**auth, "MLFLOW_TRACKING_INSECURE_TLS": "true"})
        c.expect_logged(os.path.join(c.tmp, "insecure"), "MLFLOW_TRACKING_INSECURE_TLS")
        before = proxy.counts()
        r = c.train(os.path.join(c.tmp, "untrusted"), uri, "train.stop_at_step=4", env=auth)
        if c.run_id(os.path.join(c.tmp, "untrusted")) or proxy.counts() != before:
            c.failures.append("an untrusted certificate was accepted")
        if "certificate" not in r.stderr:
            c.failures.append(f"untrusted certificate: no warning naming it: {r.stderr[-400:]}")
    finally:
        proxy.close()


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    failures = []
    password, password2 = "uRiPw" + secrets.token_hex(8), "uRiPw2" + secrets.token_hex(8)
    env_password, token = "eNvPw" + secrets.token_hex(8), "tOkEn" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory() as tmp:
        server_folder = os.path.join(tmp, "server")
        os.makedirs(server_folder)
        server = Server(server_folder, free_port())
        server.start()
        proxy = AuthProxy(server.uri, [basic("alice", password), basic("alice", password2),
                                       basic("bob", env_password), f"Bearer {token}"])
        try:
            client = MlflowClient(tracking_uri=server.uri)
            client.create_experiment("auth")  # the server's database ready before the runs
            c = Checker(trainer, source, tmp, client, failures)
            check_uri_credentials(c, proxy, server_folder, password, password2)
            check_env_credentials(c, proxy, token, env_password)
            check_tls(c, server.uri, token)
            for secret in (password, password2, env_password, token):
                c.expect_secret_kept(secret, "any run", [tmp])
        finally:
            proxy.close()
            server.stop()
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
