-- POSTs the device-API payment in $BODY_FILE (a consumable) over and over.
local file = assert(io.open(os.getenv("BODY_FILE"), "r"))
wrk.method = "POST"
wrk.path = "/device/v1/payments"
wrk.body = file:read("*a")
wrk.headers["Content-Type"] = "application/json"
file:close()
