-- wrk script of scripts/bench-e2e.sh: purchases of one product, every request a different
-- buyer (a different token), for as long as wrk runs.
--
--   wrk -t2 -c64 -d8s --latency -s loadtest/bench/buyers.lua URL -- TOKENS PRODUCT_ID [once]
--
-- PRODUCT_ID `healthz` sends `GET /healthz` instead, with the same tokens: the gateway's
-- own answer under exactly the client work of a flood.
-- TOKENS holds one token a line. Thread i of T reads the i-th of T contiguous byte ranges of
-- the file, one line per request, as it goes (nothing is loaded up front, so a file of a
-- million tokens costs wrk no memory). No response() callback: wrk then parses no headers
-- for Lua, and its status counts are `non2xx` (errors.status, any status >= 400); the bench
-- reads the exact statuses from the gateway's own metrics.
--
-- When a thread has used up its range it starts it again (those buyers then repeat; the
-- count is reported as `reused`, and the bench sizes the files so that it stays 0), unless
-- the third argument is `once`: then the thread stops, and the last one to stop ends the run
-- early (SIGINT to wrk, as loadtest/wrk/seckill.lua does), so each buyer is sent once.
--
-- One machine-readable line at the end, as loadtest/bench/report.lua prints, plus the
-- buyers taken from the file and how many were repeats.

local SIGINT = 2

local ffi_ok, ffi = pcall(require, "ffi")
if ffi_ok then
  ffi_ok = pcall(ffi.cdef, [[
    int getpid(void);
    int kill(int pid, int sig);
  ]])
end

-- Setup (main Lua state): wrk creates and initialises the threads one after the other; each
-- learns its number here. The thread count is read from the THREADS variable the bench sets
-- (it always passes -t explicitly and the same value there).
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_index", #threads)
end

-- Thread state.
local file
local range_start, range_end
local head, tail
local once = false
local exhausted = false

-- Moves the file position to the first line that starts at or after `offset`.
local function seek_line(offset)
  if offset == 0 then
    file:seek("set", 0)
    return 0
  end
  file:seek("set", offset - 1)
  local previous = file:read(1)
  if previous ~= "\n" then
    file:read("*l")
  end
  return file:seek()
end

function init(args)
  local tokens_path, product_id = args[1], args[2]
  assert(tokens_path and product_id, "usage: -- TOKENS PRODUCT_ID [once]")
  once = args[3] == "once"
  local count = tonumber(os.getenv("THREADS") or "")
  assert(count, "set THREADS to wrk's -t value")
  file = assert(io.open(tokens_path, "rb"))
  local size = file:seek("end")
  -- The line starting in this thread's byte range are its buyers.
  local first = math.floor(size * (thread_index - 1) / count)
  local last = math.floor(size * thread_index / count)
  range_start = seek_line(first)
  range_end = last == size and size or seek_line(last)
  file:seek("set", range_start)
  -- A request is this prefix, the token, this suffix: the same bytes wrk.format would build
  -- with the header, at a concatenation per request.
  local marker = "\1TOKEN\1"
  local method, path = "POST", "/api/seckill/" .. product_id
  if product_id == "healthz" then
    method, path = "GET", "/healthz"
  end
  local template = wrk.format(method, path, { ["Authorization"] = "Bearer " .. marker },
    method == "POST" and "" or nil)
  local at = template:find(marker, 1, true)
  head = template:sub(1, at - 1)
  tail = template:sub(at + #marker)
  r_taken = 0
  r_reused = 0
  r_stopped = false
  thread_count = count
  done_file = os.getenv("BUYERS_DONE_FILE")
end

local function next_token()
  while true do
    if file:seek() < range_end then
      local line = file:read("*l")
      if line and line ~= "" then
        return line
      end
    elseif once or range_end <= range_start then
      return nil
    else
      -- Round again: these buyers were seen already.
      file:seek("set", range_start)
      exhausted = true
    end
  end
end

-- Ends this thread; the last thread to end stops the run.
local function finish()
  if r_stopped then
    return
  end
  r_stopped = true
  if done_file then
    local f = io.open(done_file, "ab")
    if f then
      f:write("x")
      f:close()
      local check = io.open(done_file, "rb")
      local size = check and check:seek("end") or 0
      if check then
        check:close()
      end
      if size >= thread_count and ffi_ok then
        ffi.C.kill(ffi.C.getpid(), SIGINT)
      end
    end
  end
  wrk.thread:stop()
end

local idle = wrk.format("GET", "/healthz")

function request()
  local token = next_token()
  if not token then
    finish()
    -- wrk needs a request even from a stopping thread; it is never read back.
    return idle
  end
  r_taken = r_taken + 1
  if exhausted then
    r_reused = r_reused + 1
  end
  return head .. token .. tail
end

-- Back in the setup state after the run.
function done(summary, latency, requests)
  local taken, reused = 0, 0
  for _, thread in ipairs(threads) do
    taken = taken + (thread:get("r_taken") or 0)
    reused = reused + (thread:get("r_reused") or 0)
  end
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%.0f p90_us=%.0f p99_us=%.0f "
      .. "p999_us=%.0f max_us=%.0f connect_err=%d read_err=%d write_err=%d "
      .. "timeout_err=%d non2xx=%d taken=%d reused=%d\n",
    summary.requests, summary.duration, summary.requests / seconds,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max,
    e.connect, e.read, e.write, e.timeout, e.status, taken, reused))
end
