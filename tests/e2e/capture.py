"""A packet capture for the tests: every TCP payload to or from one address on loopback, read from an AF_PACKET
socket (what tcpdump reads), so a test can show what crossed the wire. Needs CAP_NET_RAW (root)."""

import socket
import threading
from types import TracebackType

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
ETHERNET_HEADER = 14


def can_capture() -> bool:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)).close()
    except (PermissionError, AttributeError, OSError):
        return False
    return True


class Capture:
    """`with Capture("127.0.0.2") as wire: …; wire.payloads()`: the TCP payloads seen, in order."""

    def __init__(self, address: str, interface: str = "lo") -> None:
        self.address = socket.inet_aton(address)
        self.interface = interface
        self.segments: list[tuple[int, int, bytes]] = []
        """(source port, destination port, payload) of each TCP segment with data."""
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> "Capture":
        self._sock.bind((self.interface, 0))
        self._sock.settimeout(0.2)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                frame, meta = self._sock.recvfrom(1 << 18)
            except TimeoutError:
                continue
            except OSError:
                return
            if meta[2] != PACKET_OUTGOING:  # on loopback each packet is seen going out and coming in: once
                self._take(frame)

    def _take(self, frame: bytes) -> None:
        ip = frame[ETHERNET_HEADER:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_TCP:
            return
        if self.address not in (ip[12:16], ip[16:20]):
            return
        total, ip_header = int.from_bytes(ip[2:4]), (ip[0] & 0x0F) * 4
        tcp = ip[ip_header:total]
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            self.segments.append((int.from_bytes(tcp[0:2]), int.from_bytes(tcp[2:4]), bytes(payload)))

    def ports(self) -> set[int]:
        """The ports payloads went to or came from."""
        return {port for source, destination, _ in self.segments for port in (source, destination)}

    def payloads(self) -> bytes:
        return b"".join(payload for _, _, payload in self.segments)
