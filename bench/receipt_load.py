"""Shared by the load scripts: receipts uploaded on raw keep-alive sockets from several processes, and a
wait until the server's queue is empty."""
import json
import multiprocessing
import re
import socket
import threading
import time


def submit(args):
    """One process: eight keep-alive connections (threads) writing prepared request bytes on raw
    sockets (http.client would cost the load generator more CPU than the server spends); returns
    the statuses that were not 202."""
    host, port, key, chunk = args
    bad = []
    head = (f"POST /v1/receipts HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n").encode()
    length_pattern = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")

    def run(part):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""
        for body in part:
            sock.sendall(head % len(body) + body)
            while True:
                end = buffer.find(b"\r\n\r\n")
                if end >= 0:
                    length = int(length_pattern.search(buffer, 0, end + 2).group(1))
                    if len(buffer) >= end + 4 + length:
                        break
                received = sock.recv(65536)
                if not received:
                    raise ConnectionError("server closed the connection")
                buffer += received
            status = int(buffer[9:12])
            buffer = buffer[end + 4 + length:]
            if status != 202:
                bad.append(status)
        sock.close()

    threads = [threading.Thread(target=run, args=(chunk[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return bad


def upload_all(host, port, key, bodies, processes=8):
    """Uploads every body; returns the refused statuses."""
    failures = []
    # Processes, not threads alone: one Python process cannot send requests as fast as the server takes them.
    with multiprocessing.Pool(processes) as pool:
        for bad in pool.map(submit, [(host, port, key, bodies[i::processes]) for i in range(processes)]):
            failures += bad
    return failures


def wait_settled(call):
    """Polls the job counts until nothing is pending, verifying or timed out; returns the counts."""
    while True:
        status, jobs = call("GET", "/admin/v1/jobs?limit=1")
        counts = jobs["counts"]
        if counts.get("pending", 0) + counts.get("verifying", 0) + counts.get("timed_out", 0) == 0:
            return counts
        time.sleep(0.05)
