import unittest

from tollgate_client import (
    Abandon,
    Check,
    Decision,
    ErrorCode,
    ErrorReply,
    Outcome,
    ProtocolError,
    Reason,
    Report,
    Subject,
    Verdict,
    decode_response,
    encode_request,
    password_digest,
    password_tag,
)
from tollgate_client.protocol import PROTOCOL_VERSION, RESPONSE_PAYLOAD_BYTES_MAX

from vectors import load, named, protocol_vectors

SUBJECT_FIELDS = ("peer", "forwarded_for", "account", "device", "tenant", "client_id")
# Request variants this client sends; the admin ones are the CLI's.
CLIENT_REQUESTS = {0, 1, 8}


def subject_of(values):
    return Subject(**{f: values.get("subject." + f) for f in SUBJECT_FIELDS})


def request_of(values):
    variant = values["Request variant"]
    route, subject = values["route"], subject_of(values)
    if variant == 0:
        return Check(route, subject, values.get("password_tag"))
    if variant == 1:
        return Report(route, subject, Outcome(values["outcome"]), values.get("password_digest"), values.get("password_tag"))
    return Abandon(route, subject)


class RequestVectors(unittest.TestCase):
    def test_every_check_report_and_abandon_vector_encodes_to_its_frame(self):
        seen = set()
        for vector in protocol_vectors():
            if vector["kind"] != "request":
                continue
            values = named(vector)
            if values["Request variant"] not in CLIENT_REQUESTS:
                continue
            with self.subTest(vector["name"]):
                frame = encode_request(vector.get("version", 1), vector["id"], request_of(values))
                self.assertEqual(frame.hex(), vector["frame"])
                seen.add((values["Request variant"], vector.get("version", 1)))
        self.assertTrue({(0, v) for v in range(1, 6)} <= seen, seen)
        self.assertIn((1, 1), seen)
        self.assertIn((1, 3), seen)
        self.assertIn((8, 5), seen)

    def test_a_tag_below_version_3_is_dropped(self):
        subject = Subject(peer="198.51.100.7", account="alice")
        tagged = encode_request(2, 1, Check("login", subject, bytes(16)))
        self.assertEqual(tagged, encode_request(2, 1, Check("login", subject)))
        self.assertEqual(len(encode_request(3, 1, Check("login", subject, bytes(16)))), len(tagged) + 17)


class ResponseVectors(unittest.TestCase):
    def test_every_verdict_and_error_vector_decodes_to_its_fields(self):
        decoded = 0
        for vector in protocol_vectors():
            if vector["kind"] != "response":
                continue
            values = named(vector)
            payload = bytes.fromhex(vector["frame"])[4:]
            # A newer version's reply (the daemon's admin requests): this
            # client never asks in it, and refuses such a frame.
            if values["Response variant"] not in (0, 5) or values["version"] > PROTOCOL_VERSION:
                with self.subTest(vector["name"]):
                    self.assertRaises(ProtocolError, decode_response, payload)
                continue
            with self.subTest(vector["name"]):
                version, reply_id, response = decode_response(payload)
                self.assertEqual(version, values["version"])
                self.assertEqual(reply_id, values["request id"])
                if values["Response variant"] == 0:
                    expected = Verdict(
                        Decision(values["decision"]),
                        values["retry_after_ms"],
                        values["delay_ms"],
                        values["limit"],
                        values["remaining"],
                        values["reset_ms"],
                        Reason(values["reason"]),
                        values["rule"],
                        values.get("flags", 0),
                    )
                    self.assertEqual(response, expected)
                    self.assertEqual(response.degraded, bool(values.get("flags", 0) & 1))
                else:
                    self.assertEqual(response, ErrorReply(ErrorCode(values["code"]), values["message"]))
                decoded += 1
        self.assertGreaterEqual(decoded, 28)

    def verdict_payload(self, version):
        for vector in protocol_vectors():
            if vector["name"] == "verdict-deny-degraded-v5":
                payload = bytearray(bytes.fromhex(vector["frame"])[4:])
                payload[0] = version
                return payload
        raise AssertionError("vector missing")

    def test_reserved_flag_bits_are_ignored(self):
        payload = self.verdict_payload(5)
        payload[-1] = 0xFE
        _, _, verdict = decode_response(bytes(payload))
        self.assertFalse(verdict.degraded)

    def test_malformed_replies_are_refused(self):
        good = bytes(self.verdict_payload(5))
        bad = {
            "trailing byte": good + b"\x00",
            "truncated": good[:-1],
            "short envelope": good[:8],
            "version 6": b"\x06" + good[1:],
            "version 0": b"\x00" + good[1:],
            "unknown decision": good[:13] + b"\x09\x00\x00\x00" + good[17:],
            "v1 with flags": b"\x01" + good[1:],
            "unknown variant": good[:9] + b"\x09\x00\x00\x00" + good[13:],
        }
        for name, payload in bad.items():
            with self.subTest(name):
                self.assertRaises(ProtocolError, decode_response, payload)
        invalid_utf8 = bytearray(good)
        invalid_utf8[-2] = 0xFF
        self.assertRaises(ProtocolError, decode_response, bytes(invalid_utf8))
        self.assertEqual(RESPONSE_PAYLOAD_BYTES_MAX, 8388608)


class PasswordVectors(unittest.TestCase):
    def test_every_password_vector(self):
        vectors = load("passwords.json")["vectors"]
        self.assertGreaterEqual(len(vectors), 7)
        for v in vectors:
            with self.subTest(account=v["account"][:20], password=v["password"][:20]):
                key = bytes.fromhex(v["key"])
                self.assertEqual(password_digest(key, v["account"], v["password"]).hex(), v["digest"])
                self.assertEqual(password_tag(key, v["password"]).hex(), v["tag"])

    def test_the_protocol_md_example(self):
        key = bytes([7] * 32)
        self.assertEqual(password_digest(key, "alice", "hunter2").hex(), "a781c11aa90192e358dee98ccfef7ac0")
        self.assertEqual(password_tag(key, "hunter2").hex(), "7a7bd4a52a5835dc81e0f6c0e797d285")

    def test_a_key_must_be_32_bytes(self):
        self.assertRaises(ValueError, password_tag, bytes(31), "x")


if __name__ == "__main__":
    unittest.main()
