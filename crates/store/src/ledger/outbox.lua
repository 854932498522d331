-- Prepended to purchase.lua and take.lua (mod.rs): the one way a unit taken in a bucket is
-- written to that bucket's outbox stream, so the relay and rebuilds read one entry format.
--
-- append_outbox(stream, request id, order message JSON, HTTP request id, traceparent,
-- tracestate) adds the entry and returns its id. The W3C traceparent ('' or nil: none) and
-- its tracestate (likewise) ride along so the relay publishes the order in the click's trace.
local function append_outbox(stream, request_id, payload, http_request_id, traceparent, tracestate)
  local fields = {'request_id', request_id, 'payload', payload, 'http_request_id', http_request_id}
  if traceparent and traceparent ~= '' then
    table.insert(fields, 'traceparent')
    table.insert(fields, traceparent)
    if tracestate and tracestate ~= '' then
      table.insert(fields, 'tracestate')
      table.insert(fields, tracestate)
    end
  end
  return redis.call('XADD', stream, '*', unpack(fields))
end

