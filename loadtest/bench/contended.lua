-- wrk script of scripts/bench-e2e.sh's `contended` scenario: a sale run to its end. Every
-- token of the file buys one product once, as fast as wrk sends, and every purchase's send
-- and answer times are written down, so that the bench can tell when the last unit sold and
-- which `410 sold out` answers came while units remained.
--
--   THREADS=2 wrk -t2 -c64 -d300s -s loadtest/bench/contended.lua URL -- TOKENS PRODUCT_ID RECORDS
--
-- TOKENS holds one token a line, each one buyer: thread i of T takes the i-th of T contiguous
-- byte ranges of the file and reads it as it goes, one line per purchase (as
-- loadtest/bench/buyers.lua does). T comes from the THREADS variable (the bench passes -t and
-- the same value there).
--
-- A purchase carries `X-Request-Id: <thread>-<n>`, which the gateway sends back on its
-- answer; that is how response() finds the purchase's send time (wrk tells a script nothing
-- of which connection answered). Each answer appends a line to RECORDS.<thread>:
--
--   <sent µs> <answered µs> <status>
--
-- on CLOCK_MONOTONIC (shared by the threads; LuaJIT's ffi is required), sent = when request()
-- handed the purchase to wrk, answered = when response() saw its answer. The bench reads
-- these files once wrk has exited (its exit flushes them).
--
-- Once a thread has sent all its buyers it sends `GET /healthz` (recorded nowhere) on the
-- connections that come free until its last purchase is answered; then it stops, and the
-- last thread to stop ends the run (SIGINT to wrk, as loadtest/wrk/seckill.lua does), so -d
-- only bounds a run in which an answer never comes. wrk checks the script before the run by
-- calling request() once in the first thread: that call sends nothing and uses up no buyer.
--
-- The last line printed is machine-readable, as loadtest/bench/buyers.lua prints, plus the
-- purchases sent and answered and the threads that finished.

local SIGINT = 2
local CLOCK_MONOTONIC = 1 -- Linux

local ffi = require("ffi")
ffi.cdef([[
  typedef struct { long tv_sec; long tv_nsec; } contended_timespec;
  int clock_gettime(int clock_id, contended_timespec *tp);
  int getpid(void);
  int kill(int pid, int sig);
]])

local clock = ffi.new("contended_timespec")

-- Microseconds on the monotonic clock (a double: exact far beyond any uptime).
local function now_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, clock)
  return tonumber(clock.tv_sec) * 1000000 + math.floor(tonumber(clock.tv_nsec) / 1000)
end

-- Setup (main Lua state): wrk creates and initialises the threads one after the other, each
-- learns its number here.
local threads = {}
local run_done_file

function setup(thread)
  run_done_file = run_done_file or os.tmpname()
  table.insert(threads, thread)
  thread:set("thread_index", #threads)
  thread:set("done_file", run_done_file)
end

-- Thread state.
local file, range_end
local records
local head, middle, tail
local token_first
local filler
local sent_at = {}
local checked = false
local stopped = false

-- Moves the file position to the first line that starts at or after `offset`.
local function seek_line(offset)
  if offset == 0 then
    file:seek("set", 0)
    return 0
  end
  file:seek("set", offset - 1)
  if file:read(1) ~= "\n" then
    file:read("*l")
  end
  return file:seek()
end

function init(args)
  local tokens_path, product_id, records_path = args[1], args[2], args[3]
  assert(tokens_path and product_id and records_path, "usage: -- TOKENS PRODUCT_ID RECORDS")
  thread_count = tonumber(os.getenv("THREADS") or "")
  assert(thread_count, "set THREADS to wrk's -t value")
  file = assert(io.open(tokens_path, "rb"))
  local size = file:seek("end")
  local first = math.floor(size * (thread_index - 1) / thread_count)
  local last = math.floor(size * thread_index / thread_count)
  local range_start = seek_line(first)
  range_end = last == size and size or seek_line(last)
  file:seek("set", range_start)
  records = assert(io.open(records_path .. "." .. thread_index, "wb"))
  records:setvbuf("full", 1048576)
  -- A purchase is head .. token .. middle .. id .. tail: the bytes wrk.format builds with
  -- both headers, at three concatenations per request.
  local token_marker, id_marker = "\1TOKEN\1", "\1ID\1"
  local template = wrk.format("POST", "/api/seckill/" .. product_id, {
    ["Authorization"] = "Bearer " .. token_marker,
    ["X-Request-Id"] = id_marker,
  }, "")
  local t, i = template:find(token_marker, 1, true), template:find(id_marker, 1, true)
  assert(t and i, "wrk.format lost a header")
  if t < i then
    head, middle, tail = template:sub(1, t - 1), template:sub(t + #token_marker, i - 1),
      template:sub(i + #id_marker)
    token_first = true
  else
    head, middle, tail = template:sub(1, i - 1), template:sub(i + #id_marker, t - 1),
      template:sub(t + #token_marker)
    token_first = false
  end
  filler = wrk.format("GET", "/healthz")
  r_sent = 0
  r_answered = 0
  r_unmatched = 0
  r_finished = false
end

local function next_token()
  while file:seek() < range_end do
    local line = file:read("*l")
    if line and line ~= "" then
      return line
    end
  end
  return nil
end

-- Ends this thread; the last thread to end stops the run.
local function finish()
  if stopped then
    return
  end
  stopped = true
  r_finished = true
  records:close()
  local f = io.open(done_file, "ab")
  if f then
    f:write("x")
    f:close()
    local check = io.open(done_file, "rb")
    local size = check and check:seek("end") or 0
    if check then
      check:close()
    end
    if size >= thread_count then
      ffi.C.kill(ffi.C.getpid(), SIGINT)
    end
  end
  wrk.thread:stop()
end

local exhausted = false

function request()
  if not checked then
    checked = true
    if thread_index == 1 then
      -- wrk's check of the script before the run: nothing is sent.
      return filler
    end
  end
  local token = not exhausted and next_token()
  if not token then
    exhausted = true
    if r_answered >= r_sent then
      finish()
    end
    return filler
  end
  r_sent = r_sent + 1
  local id = thread_index .. "-" .. r_sent
  sent_at[id] = now_us()
  if token_first then
    return head .. token .. middle .. id .. tail
  end
  return head .. id .. middle .. token .. tail
end

function response(status, headers, body)
  local id = headers["x-request-id"] or headers["X-Request-Id"]
  local sent = id and sent_at[id]
  if not sent then
    -- A filler's answer (200), or an answer that did not bring its id back.
    if status ~= 200 then
      r_unmatched = r_unmatched + 1
    end
    return
  end
  sent_at[id] = nil
  r_answered = r_answered + 1
  records:write(string.format("%.0f %.0f %d\n", sent, now_us(), status))
  if exhausted and r_answered >= r_sent then
    finish()
  end
end

-- Back in the setup state after the run.
function done(summary, latency, requests)
  if run_done_file then
    os.remove(run_done_file)
  end
  local sent, answered, unmatched, finished = 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    sent = sent + (thread:get("r_sent") or 0)
    answered = answered + (thread:get("r_answered") or 0)
    unmatched = unmatched + (thread:get("r_unmatched") or 0)
    if thread:get("r_finished") then
      finished = finished + 1
    end
  end
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%.0f p90_us=%.0f p99_us=%.0f "
      .. "p999_us=%.0f max_us=%.0f connect_err=%d read_err=%d write_err=%d "
      .. "timeout_err=%d non2xx=%d taken=%d reused=0 answered=%d unmatched=%d "
      .. "threads=%d finished=%d\n",
    summary.requests, summary.duration, summary.requests / seconds,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max,
    e.connect, e.read, e.write, e.timeout, e.status, sent, answered, unmatched,
    #threads, finished))
end
