"""A server on the test host that the nested guests reach as 10.0.2.2: it answers every GET
with 200 and records, one JSON line per event in LOG, each request (its Host, Authorization
and path) and, with TLS, each handshake (the server name the client asked for, and why it
failed when it did). Usage: host_server.py PORT LOG [CERT KEY]."""

import http.server
import json
import ssl
import sys

port, log_path = int(sys.argv[1]), sys.argv[2]
log = open(log_path, "a", buffering=1)


def record(**event):
    log.write(json.dumps(event) + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        record(event="request", host=self.headers.get("Host"),
               auth=self.headers.get("Authorization"), path=self.path)
        body = b"hello from the host\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    def get_request(self):
        sock, address = self.socket.accept()
        if tls is None:
            return sock, address
        try:
            return tls.wrap_socket(sock, server_side=True), address
        except (ssl.SSLError, OSError) as e:
            record(event="handshake failed", reason=str(e))
            sock.close()
            raise


tls = None
if len(sys.argv) > 4:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(sys.argv[3], sys.argv[4])
    tls.sni_callback = lambda _sock, name, _ctx: record(event="handshake", sni=name)

server = Server(("127.0.0.1", port), Handler)
record(event="listening", port=port)
server.serve_forever()
