-- What makes NVML device and process rows one poll, as an Int64 expression over a row's `ts`: in the 1 s tier the
-- poll's time in ms (a poll's device and process rows share it); past it (nvml_tier) the 10 s bucket (in ms), since a
-- bucket's device and process rows stand at their own first readings.
if(
    -- @include nvml_tier
    , toUnixTimestamp64Milli(ts), intDiv(toUnixTimestamp64Milli(ts), 10000) * 10000)
