-- wrk flash-sale burst: every token in a file buys PRODUCT_ID exactly once.
--
-- Usage:
--   seckill-token --sub 1 --count 5000 > /tmp/tokens.txt
--   TOKENS=/tmp/tokens.txt PRODUCT_ID=7 wrk -t2 -c256 -d60s -s loadtest/wrk/seckill.lua \
--       http://127.0.0.1:8080
--   (or pass them as script arguments: ... -s loadtest/wrk/seckill.lua URL -- /tmp/tokens.txt 7)
--
-- Tokens are dealt round-robin to wrk's threads; a thread stops once each of its tokens got
-- an answer. Connections that become free after a thread sent its last purchase are given a
-- GET /healthz instead, so no buyer is sent twice; those 200s are reported as filler.
-- -d only bounds the run: make it long enough for every purchase to be answered.

local threads = {}

-- Setup environment: number each thread and tell every thread how many there are.
function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_index", #threads)
  for _, t in ipairs(threads) do
    t:set("thread_count", #threads)
  end
end

-- Thread environment from here on.
local purchases = {}
local next_purchase = 1
local answered = 0
local filler

function init(args)
  local tokens_path = args[1] or os.getenv("TOKENS")
  local product_id = args[2] or os.getenv("PRODUCT_ID")
  assert(tokens_path, "set TOKENS (a file of tokens from `seckill-token --count N`)")
  assert(product_id, "set PRODUCT_ID")
  local path = "/api/seckill/" .. product_id

  local line_number = 0
  for line in io.lines(tokens_path) do
    local token = line:match("^%s*(.-)%s*$")
    if token ~= "" then
      line_number = line_number + 1
      -- Round-robin: this thread takes every thread_count-th token.
      if (line_number - 1) % thread_count == thread_index - 1 then
        local headers = { ["Authorization"] = "Bearer " .. token }
        -- An empty body makes wrk send Content-Length: 0.
        table.insert(purchases, wrk.format("POST", path, headers, ""))
      end
    end
  end
  filler = wrk.format("GET", "/healthz")
  statuses = {}
end

function request()
  local purchase = purchases[next_purchase]
  if purchase then
    next_purchase = next_purchase + 1
    return purchase
  end
  return filler
end

function response(status, headers, body)
  -- A purchase never answers 200 (success is 202), so a 200 is a filler health check.
  local key = status == 200 and "filler" or tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
  if key ~= "filler" then
    answered = answered + 1
  end
  if answered >= #purchases then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local totals = {}
  for _, thread in ipairs(threads) do
    local counts = thread:get("statuses") or {}
    for status, n in pairs(counts) do
      totals[status] = (totals[status] or 0) + n
    end
  end
  local keys = {}
  for status in pairs(totals) do
    table.insert(keys, status)
  end
  table.sort(keys)
  io.write("seckill status counts:\n")
  for _, status in ipairs(keys) do
    io.write(string.format("  %-8s %d\n", status, totals[status]))
  end
  io.write(string.format("socket errors: connect %d, read %d, write %d, timeout %d\n",
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
  io.write(string.format("latency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
