-- Argo CD health of a kgroup.dev ConsumerGroup, read from the conditions its operator
-- writes (kstatus conventions: docs/operations.md, "GitOps health"):
--   status not written yet, or written for an older spec generation -> Progressing
--   Stalled=True (partitions stalled or unowned too long, or another problem) -> Degraded
--   spec.paused -> Suspended
--   Reconciling=True (a rebalance under way) -> Progressing
--   Ready=True -> Healthy; otherwise Progressing (no member yet, partitions briefly unowned)
local hs = {}
local status = obj.status
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kgroup operator to write the status"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the kgroup operator to observe generation " .. tostring(generation)
  return hs
end
local conditions = {}
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    conditions[condition.type] = condition
  end
end
local function says(ctype, value)
  local condition = conditions[ctype]
  return condition ~= nil and condition.status == value
end
local function text(condition)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return condition.reason or ""
end
if says("Stalled", "True") then
  hs.status = "Degraded"
  hs.message = text(conditions["Stalled"])
  return hs
end
if obj.spec ~= nil and obj.spec.paused == true then
  hs.status = "Suspended"
  hs.message = "ConsumerGroup is paused (spec.paused): its target assignment is frozen"
  return hs
end
if says("Reconciling", "True") then
  hs.status = "Progressing"
  hs.message = text(conditions["Reconciling"])
  return hs
end
if says("Ready", "True") then
  hs.status = "Healthy"
  hs.message = text(conditions["Ready"])
  return hs
end
hs.status = "Progressing"
if conditions["Ready"] ~= nil then
  hs.message = text(conditions["Ready"])
else
  hs.message = "Waiting for the Ready condition"
end
return hs
