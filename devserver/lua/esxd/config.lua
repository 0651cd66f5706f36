-- esxd.config: run-time settings. The generated nginx.conf replaces this module with the
-- values given on the esxd command line (package.loaded["esxd.config"] = {...}).
return { user = nil, password = nil, max_body = 100 * 1024 * 1024, port = 9200, tls = false }
