#!/usr/bin/env python3
r"""A fault-injecting HTTP/1.1 loopback proxy for the S3 client's tests (standard library only).

  python3 tests/s3/fault_proxy.py --listen-port 0 --upstream 127.0.0.1:7480 \
      --rules RULES.json --port-file FILE [--stats FILE] [--listen-host 127.0.0.1] \
      [--tls-cert CERT.pem --tls-key KEY.pem]

Requests go upstream byte for byte (Host included, so SigV4 signatures made for
127.0.0.1:<proxy port> stay valid), over one persistent upstream connection per client
connection; Expect: 100-continue and chunked bodies pass through. With --tls-cert the
proxy speaks HTTPS to its clients (a client trusting that certificate: AWS_CA_BUNDLE). --listen-port 0 picks a
free port, which --port-file receives (atomically) once the proxy listens. SIGTERM stops it.

RULES.json, a JSON list, is re-read whenever it changes (missing: no rules; unparsable: the
previous rules stay). The first rule that matches a request and has times left applies:
  {"method": "PUT" | "GET" | ... | "*", "key": REGEX searched in the target (path+query),
   "action": ACTION, "times": N (default unlimited), ...the action's parameters}
A rule's count survives re-reads while its JSON text is unchanged. Actions:
  slowdown            answer 503 SlowDown (S3 XML error); the request is not forwarded
  status              answer "status" (e.g. 500) with S3 error "code" (and "message")
  drop                reset the client connection after the request headers
  drop_after_forward  forward and read the response, then reset the client connection
  stall               sleep "seconds", then forward
  rate                forward, pacing the request and response bodies to "bytes_per_s"
slowdown and status read and drop the request body first. stderr gets a line per request
(method, target with signatures redacted, action or "pass", upstream status), and --stats
FILE gets {"requests": n, "by_action": {...}} after each request.
"""
import argparse, http.client, json, os, re, select, signal, socket, socketserver, struct, sys
import threading, time

CHUNK = 65536
SECRET_QUERY = re.compile(r"(?i)((?:X-Amz-)?(?:Signature|Credential|Security-Token)=)[^&]*")
REDACTED = r"\1REDACTED"
SLOWDOWN = {"status": 503, "code": "SlowDown", "message": "Please reduce your request rate."}
LOG_LOCK = threading.Lock()


def log(msg):
    with LOG_LOCK:
        print(f"fault_proxy: {msg}", file=sys.stderr, flush=True)


def write_atomic(path, text):
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Reader:
    """Buffered reads from a socket; EOFError when the peer closes."""

    def __init__(self, sock):
        self.sock, self.buf = sock, bytearray()

    def fill(self):
        data = self.sock.recv(CHUNK)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def take(self, n):
        data = bytes(self.buf[:n]); del self.buf[:n]
        return data

    def readline(self):
        while b"\n" not in self.buf:
            if len(self.buf) > CHUNK:
                raise ValueError("line too long")
            self.fill()
        return self.take(self.buf.index(b"\n") + 1)

    def read_some(self, n):
        if not self.buf:
            self.fill()
        return self.take(n)


class Pacer:
    """A send rate of bytes_per_s, in pieces of at most 64 KiB."""

    def __init__(self, bps):
        self.bps, self.t0, self.sent = float(bps), None, 0
        self.piece = max(1, min(CHUNK, int(self.bps / 10)))


def send(sock, data, pacer=None):
    """Sends data to sock (None drops it), paced when a Pacer is given."""
    if sock is None or not pacer:
        return sock and sock.sendall(data)
    for i in range(0, len(data), pacer.piece):
        pacer.t0 = pacer.t0 or time.monotonic()
        part = data[i:i + pacer.piece]
        sock.sendall(part)
        pacer.sent += len(part)
        time.sleep(max(0.0, pacer.t0 + pacer.sent / pacer.bps - time.monotonic()))


def read_head(reader):
    """(start line, raw head bytes, lower-cased headers) of the next message."""
    start = reader.readline()
    while start in (b"\r\n", b"\n"):  # tolerate stray blank lines between messages
        start = reader.readline()
    lines, headers = [start], {}
    while (line := reader.readline()) not in (b"\r\n", b"\n"):
        lines.append(line)
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = headers[name] + ", " + value if name in headers else value
    return start.decode("latin-1").rstrip("\r\n"), b"".join(lines) + line, headers


def framing(headers):
    """The body's framing: "chunked", the Content-Length, or None (neither given)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked"
    length = headers.get("content-length")
    return None if length is None else int(length.split(",")[0])


def copy_body(reader, sock, frame, pacer=None):
    """Copies one body (a length, "chunked" or "eof") to sock (None drops it)."""
    if frame == "chunked":
        while True:
            line = reader.readline()
            send(sock, line)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:  # the trailers, up to the blank line
                while line not in (b"\r\n", b"\n"):
                    line = reader.readline()
                    send(sock, line)
                return
            copy_body(reader, sock, size, pacer)
            send(sock, reader.readline())
    if frame == "eof":
        try:
            while True:
                send(sock, reader.read_some(CHUNK), pacer)
        except EOFError:
            return
    left = frame or 0
    while left > 0:
        data = reader.read_some(min(left, CHUNK))
        left -= len(data)
        send(sock, data, pacer)


class Rules:
    """The rules file, re-read when it changes, with per-rule counts keyed by JSON text."""

    def __init__(self, path):
        self.path, self.stamp, self.rules, self.counts = path, None, [], {}
        self.lock = threading.Lock()

    def reload(self):
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except (OSError, TypeError):
            stamp = None
        if stamp == self.stamp:
            return
        try:
            rules = []
            if stamp:
                with open(self.path) as f:
                    rules = json.load(f)
            assert isinstance(rules, list) and all(isinstance(r, dict) for r in rules)
            for rule in rules:
                re.compile(rule.get("key", ""))
        except Exception as e:  # a half-written file: keep the rules we have
            return log(f"rules: cannot use {self.path}: {e}; keeping the previous rules")
        keyed, seen = [], {}
        for rule in rules:  # identical rules are told apart by their rank
            text = json.dumps(rule, sort_keys=True)
            seen[text] = seen.get(text, -1) + 1
            keyed.append(((text, seen[text]), rule))
        self.stamp, self.rules = stamp, keyed
        self.counts = {k: self.counts.get(k, 0) for k, _ in keyed}

    def match(self, method, target):
        """The first matching rule with times left (and counts it), or None."""
        with self.lock:
            self.reload()
            for key, rule in self.rules:
                times = rule.get("times")
                if str(rule.get("method", "*")).upper() in ("*", method.upper()) and \
                        re.search(rule.get("key", ""), target) and \
                        (times is None or self.counts[key] < times):
                    self.counts[key] += 1
                    return rule
        return None


def abort(sock):
    """Closes with a reset: the client sees a failed connection, not a clean end."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def error_response(fault):
    status = int(fault.get("status", 500))
    body = (f"<Error><Code>{fault.get('code', 'InternalError')}</Code><Message>"
            f"{fault.get('message', 'Injected fault.')}</Message></Error>").encode()
    reason = http.client.responses.get(status, "Injected")
    return status, (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class Handler(socketserver.BaseRequestHandler):
    def setup(self):
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client, self.up, self.upr = Reader(self.request), None, None

    def handle(self):
        try:
            while self.one_request():
                pass
        except (EOFError, OSError, ValueError) as e:
            if not isinstance(e, EOFError):  # EOF: the client closed between requests
                log(f"connection ended: {type(e).__name__}: {e}")
        finally:
            self.close_upstream()

    def close_upstream(self):
        if self.up:
            self.up.close()
        self.up = self.upr = None

    def connect_upstream(self):
        # An idle upstream connection that reads as ready was closed by the gateway.
        if self.up and (select.select([self.up], [], [], 0)[0] or self.upr.buf):
            self.close_upstream()
        if not self.up:
            self.up = socket.create_connection(self.server.upstream, timeout=600)
            self.up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.upr = Reader(self.up)

    def one_request(self):
        """Serves one request; False when the client connection is done."""
        sock, server = self.request, self.server
        start, head, headers = read_head(self.client)
        method, target = (start.split(" ") + ["", ""])[:2]
        rule = server.rules.match(method, target)
        action = rule.get("action", "pass") if rule else "pass"
        frame = framing(headers)
        has_body = frame == "chunked" or bool(frame)
        expect = has_body and headers.get("expect", "").lower() == "100-continue"
        keep = "close" not in headers.get("connection", "").lower()
        status = "-"
        try:
            if action == "drop":
                abort(sock)
                return False
            if action in ("slowdown", "status"):
                if expect:
                    sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                copy_body(self.client, None, frame)
                status, response = error_response(SLOWDOWN if action == "slowdown" else rule)
                sock.sendall(response)
                return keep
            if action == "stall":
                time.sleep(float(rule.get("seconds", 1)))
            rate = rule.get("bytes_per_s") if action == "rate" else None
            self.connect_upstream()
            self.up.sendall(head)
            if expect and not self.client.buf:  # wait for the gateway's 100 or the body
                if self.up in select.select([self.up, sock], [], [], 30)[0]:
                    early = read_head(self.upr)
                    if not early[0].split(" ")[1].startswith("1"):
                        # A final answer before the body: its fate is unknown, end both.
                        status, _ = self.relay_response(method, action, None, early)
                        self.close_upstream()
                        return False
                    sock.sendall(early[1])
            if has_body:
                copy_body(self.client, self.up, frame, Pacer(rate) if rate else None)
            status, close = self.relay_response(method, action, Pacer(rate) if rate else None)
            if action == "drop_after_forward":
                abort(sock)
                return False
            if close:
                self.close_upstream()
            return keep and not close
        except (EOFError, OSError, ValueError) as e:
            status = f"failed ({type(e).__name__}: {e})"
            abort(sock)
            return False
        finally:
            log(f"{method} {SECRET_QUERY.sub(REDACTED, target)} {action} {status}")
            server.count(action)

    def relay_response(self, method, action, pacer=None, head=None):
        """Relays the gateway's response (head: its head, if read already), or reads and
        drops it for drop_after_forward; returns (status, whether upstream must close)."""
        dst = None if action == "drop_after_forward" else self.request
        while True:
            rstart, rhead, rheaders = head or read_head(self.upr)
            status, head = int(rstart.split(" ")[1]), None
            send(dst, rhead)
            if status >= 200:
                break  # else an interim response (100, 103): relayed, the final one follows
        frame = 0 if method == "HEAD" or status in (204, 304) else framing(rheaders)
        copy_body(self.upr, dst, "eof" if frame is None else frame, pacer)
        return status, frame is None or "close" in rheaders.get("connection", "").lower()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = allow_reuse_address = True
    request_queue_size = 128
    tls = None  # an ssl.SSLContext: clients speak HTTPS to the proxy (the gateway stays HTTP)

    def get_request(self):
        sock, addr = super().get_request()
        return (self.tls.wrap_socket(sock, server_side=True) if self.tls else sock), addr

    def handle_error(self, request, client_address):
        log(f"connection from {client_address[0]}: {sys.exc_info()[1]!r}")  # a refused handshake, a reset

    def count(self, action):
        with self.stats_lock:
            self.stats["requests"] += 1
            self.stats["by_action"][action] = self.stats["by_action"].get(action, 0) + 1
            if self.stats_path:
                write_atomic(self.stats_path, json.dumps(self.stats) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen-host", default="127.0.0.1")
    p.add_argument("--listen-port", type=int, default=0)
    p.add_argument("--upstream", required=True, help="HOST:PORT of the gateway")
    p.add_argument("--rules", help="the rules file (a JSON list)")
    p.add_argument("--port-file", help="receives the listening port")
    p.add_argument("--stats", help="receives the request counters (JSON)")
    p.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    p.add_argument("--tls-key", help="the certificate's PEM private key")
    args = p.parse_args()
    host, _, port = args.upstream.rpartition(":")
    server = Server((args.listen_host, args.listen_port), Handler)
    server.upstream, server.rules = (host or "127.0.0.1", int(port)), Rules(args.rules)
    server.stats, server.stats_path = {"requests": 0, "by_action": {}}, args.stats
    server.stats_lock, stop = threading.Lock(), threading.Event()
    if args.tls_cert:
        import ssl
        server.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.tls.load_cert_chain(args.tls_cert, args.tls_key)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True).start()
    bound = server.server_address[1]
    if args.port_file:
        write_atomic(args.port_file, f"{bound}\n")
    log(f"listening on {args.listen_host}:{bound}, upstream {args.upstream}")
    stop.wait()
    server.shutdown()
    server.server_close()
    log("stopped")


if __name__ == "__main__":
    main()
