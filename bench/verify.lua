-- POSTs the verifyReceipt body in $BODY_FILE to the sandbox endpoint; counts bodies whose status is not 0.
local file = assert(io.open(os.getenv("BODY_FILE"), "r"))
wrk.method = "POST"
wrk.path = "/sandbox/verifyReceipt"
wrk.body = file:read("*a")
wrk.headers["Content-Type"] = "application/json"
file:close()
local bad = 0
response = function(status, headers, body)
  if status ~= 200 or not string.find(body, '"status":0', 1, true) then bad = bad + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("bad answers: %d\n", bad))
end
