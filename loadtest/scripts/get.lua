-- wrk: reads of the writepath bench's seeded objects.
local counter = 0
function request()
  counter = counter + 1
  return wrk.format("GET", string.format("/objects/%d/seed-%d", counter % 16, counter % 200))
end
