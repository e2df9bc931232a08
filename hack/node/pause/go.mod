module dispatch.local/pause

go 1.22
