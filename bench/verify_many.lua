-- POSTs the verifyReceipt bodies of $BODIES_FILE (one JSON body per line) in turn, each connection starting at its
-- own place, so consecutive requests differ; counts answers whose status is not 0.
local bodies = {}
for line in io.lines(os.getenv("BODIES_FILE")) do
  if #line > 0 then bodies[#bodies + 1] = line end
end
local next_index = 1
local bad = 0
setup = function(thread)
  thread:set("offset", next_index)
  next_index = next_index + 7919
end
init = function(args)
  position = offset or 1
end
request = function()
  position = position % #bodies + 1
  return wrk.format("POST", "/sandbox/verifyReceipt", {["Content-Type"] = "application/json"}, bodies[position])
end
response = function(status, headers, body)
  if status ~= 200 or not string.find(body, '"status":0', 1, true) then bad = bad + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("bad answers: %d\n", bad))
end
