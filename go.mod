module github.com/perfbuf/perfbuf

go 1.24.0

require golang.org/x/sys v0.30.0

require github.com/aquasecurity/libbpfgo v0.7.0-libbpf-1.4
