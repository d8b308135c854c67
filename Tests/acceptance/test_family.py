"""Family Sharing: FAMILY_SHARED transactions for the other members, REVOKE when sharing ends."""
import json

from appstoreserverlibrary.models.InAppOwnershipType import InAppOwnershipType

from test_lifecycle import wait_for
from test_notifications import Receiver, verifier
from test_server_api import new_tester
from test_storekit2_device import device_for, get


def test_shared_purchases_reach_the_family_and_leave_with_a_member(emulator, jws_root_pem):
    receiver = Receiver()
    try:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.football", "--sandbox-url", receiver.url)
        organizer, member = new_tester(emulator), new_tester(emulator)
        family = "family-" + organizer.split("@")[0]
        for email in (organizer, member):
            emulator.cli("appstore", "tester", "family", email, "--family", family)
        bought = emulator.buy("com.example.football", "GoldenGlobe", account=organizer)
        emulator.buy("com.example.football", "ProtectiveGloves", account=organizer)  # not family-shareable
        check = verifier(jws_root_pem, "com.example.football")
        device = device_for(emulator, member)
        shared = [check.verify_and_decode_signed_transaction(s)
                  for s in get(emulator, f"/device/v2/entitlements?app=com.example.football&device={device}")["signedTransactions"]]
        assert [(s.productId, s.inAppOwnershipType) for s in shared] == [("GoldenGlobe", InAppOwnershipType.FAMILY_SHARED)]
        assert shared[0].transactionId != bought["transaction_id"]
        assert ("ONE_TIME_CHARGE", None) in wait_for(receiver, check, shared[0].originalTransactionId, ("ONE_TIME_CHARGE", None))

        emulator.cli("appstore", "tester", "family", member, "--leave")
        assert ("REVOKE", None) in wait_for(receiver, check, shared[0].originalTransactionId, ("REVOKE", None))
        assert get(emulator, f"/device/v2/entitlements?app=com.example.football&device={device}")["signedTransactions"] == []
        organizer_device = device_for(emulator, organizer)
        still = get(emulator, f"/device/v2/entitlements?app=com.example.football&device={organizer_device}")["signedTransactions"]
        assert sorted(check.verify_and_decode_signed_transaction(s).productId for s in still) == ["GoldenGlobe", "ProtectiveGloves"]
    finally:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.football")
        receiver.close()


def test_shared_subscriptions_renew_with_the_purchaser_and_a_refund_revokes_them(emulator, jws_root_pem):
    receiver = Receiver()
    try:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine", "--sandbox-url", receiver.url)
        organizer, member = new_tester(emulator), new_tester(emulator)
        family = "family-" + organizer.split("@")[0]
        bought = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=organizer)
        for email in (organizer, member):  # joining later shares what the family already has
            emulator.cli("appstore", "tester", "family", email, "--family", family)
        check = verifier(jws_root_pem, "com.example.magazine")
        device = device_for(emulator, member)
        statuses = get(emulator, f"/device/v2/subscriptions/status?app=com.example.magazine&device={device}")["statuses"]
        assert len(statuses) == 1 and statuses[0]["state"] == 1
        member_original = statuses[0]["originalTransactionId"]
        assert check.verify_and_decode_signed_transaction(statuses[0]["signedTransaction"]).inAppOwnershipType == InAppOwnershipType.FAMILY_SHARED
        emulator.cli("appstore", "subscription", "renew", bought["original_transaction_id"])
        assert ("DID_RENEW", None) in wait_for(receiver, check, member_original, ("DID_RENEW", None))
        latest = json.loads(emulator.request("GET", f"/admin/v1/transactions/{bought['transaction_id']}")[1])
        renewed = get(emulator, f"/device/v2/subscriptions/status?app=com.example.magazine&device={device_for(emulator, organizer)}")["statuses"][0]
        renewal_id = check.verify_and_decode_signed_transaction(renewed["signedTransaction"]).transactionId
        assert renewal_id != latest["id"]
        emulator.cli("appstore", "refund", renewal_id)
        assert ("REVOKE", None) in wait_for(receiver, check, member_original, ("REVOKE", None))
        statuses = get(emulator, f"/device/v2/subscriptions/status?app=com.example.magazine&device={device}")["statuses"]
        assert statuses[0]["state"] == 5
    finally:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine")
        receiver.close()
