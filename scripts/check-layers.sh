#!/bin/sh
# The purchase server's layering, checked (make test runs it): every SQL statement lives in
# Sources/PurchaseServer/Repository/ (Schema.swift holds the migrations), and the rules never read a
# clock or make up an identifier (time and ids are injected: Sources/Clocks).
set -u
cd "$(dirname "$0")/.."
status=0
sql=$(grep -ln '\.query(\|"SELECT \|INSERT INTO \|DELETE FROM ' Sources/PurchaseServer/*.swift | grep -v '/Schema.swift$')
if [ -n "$sql" ]; then
    echo "SQL outside Sources/PurchaseServer/Repository/:" >&2
    echo "$sql" >&2
    status=1
fi
rules="Sources/PurchaseServer/SettlementPlan.swift Sources/PurchaseServer/EntitlementCalculator.swift Sources/PurchaseServer/RevenueReport.swift"
impure=$(grep -n 'Date()\|UUID()\|\.query(' $rules)
if [ -n "$impure" ]; then
    echo "A rule reads the clock, makes an id or queries the database:" >&2
    echo "$impure" >&2
    status=1
fi
exit $status
