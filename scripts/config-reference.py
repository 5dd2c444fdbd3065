#!/usr/bin/env python3
"""Writes docs/reference/{allotd,agent}.toml.md from the config types' doc comments and
the shipped example configs. The config modules' tests fail when a key has no row."""
import re
import os
root=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..") + "/"
def fields(path, struct):
    src=open(root+path).read()
    m=re.search(r'(pub )?struct '+struct+r' \{\n(.*?)\n\}', src, re.S)
    body=m.group(2)
    out=[]; doc=[]; attrs=[]
    for line in body.split('\n'):
        t=line.strip()
        if t.startswith('///'):
            doc.append(t[3:].strip()); continue
        if t.startswith('#['):
            attrs.append(t); continue
        fm=re.match(r'(pub )?(\w+): (.+),$', t)
        if fm:
            name, ty = fm.group(2), fm.group(3)
            skip=any('skip' in a and 'serde' in a and 'skip_serializing' not in a for a in attrs)
            if not skip:
                out.append((name, ty, ' '.join(doc)))
            doc=[]; attrs=[]
        elif t=='' or t.startswith('//'):
            pass
    return out
def examples(path):
    ex={}; sec=None
    for line in open(root+path):
        s=line.rstrip('\n')
        m=re.match(r'^\s*#?\s*\[\[?([\w.]+)\]\]?', s)
        if m and not re.match(r'^\s*#\s', s[:2]+'x') :
            sec=m.group(1)
            continue
        m=re.match(r'^#?\s*(\w+)\s*=\s*(.+?)\s*(#.*)?$', s)
        if m and sec:
            key=m.group(1); val=m.group(2)
            ex.setdefault((sec, key), val)
    return ex
def kind(ty, name):
    if 'de_duration' in name: return 'duration'
    t=ty.replace('Option<','').replace('>','')
    return {'u64':'integer','u32':'integer','usize':'integer','i64':'integer','f64':'number','bool':'boolean','String':'string','PathBuf':'path','Vec<String':'list of strings'}.get(t, t)
def table(title, section, path, struct, ex, note=''):
    rows=fields(path, struct)
    src=open(root+path).read()
    s=f"## `[{title}]`\n\n{note}| key | type | example | meaning |\n|---|---|---|---|\n"
    for name, ty, doc in rows:
        # duration fields carry de_duration in attrs; find in source
        pat=re.search(r'deserialize_with = "[^"]*duration[^"]*"\)\]\s*\n\s*pub '+name+':', src)
        k='duration' if pat else kind(ty, '')
        e=ex.get((section.split('.')[0] if section.startswith('classes') else section, name))
        if section.startswith('classes'):
            e=ex.get(('classes.training', name)) or ex.get(('classes.debug', name)) or ex.get(('classes.interactive', name))
        if section=='group':
            e=ex.get(('group', name))
        e=f"`{e}`" if e else '—'
        doc=doc.replace('|','\\|')
        s+=f"| `{name}` | {k} | {e} | {doc} |\n"
    return s+'\n'
exa=examples('packaging/etc/allotd.toml')
out="""# allotd.toml reference

Every key allotd reads, by table, with its type and meaning as the code documents it
(the `example` column is the shipped `/etc/allot/allotd.toml`; `—`: not in it, the
built-in default applies). Durations are `90s`, `10m`, `8h`, `7d` or seconds. A key
not listed here is refused at start with its line (`allotd serve --check`).
`allocator/src/config.rs` tests that every key the parser accepts is listed here.

"""
out+=table('server','server','allocator/src/config.rs','ServerSection',exa)
out+=table('policy','policy','fairshare/src/config.rs','PolicyConfig',exa)
out+=table('breaker','breaker','allocator/src/config.rs','BreakerSection',exa)
out+=table('roles','roles','allocator/src/config.rs','RolesSection',exa)
out+=table('auth','auth','allocator/src/config.rs','AuthSection',exa)
out+=table('tls','tls','allocator/src/config.rs','TlsSection',exa)
out+=table('classes.NAME','classes.NAME','allocator/src/config.rs','ClassDefaults',exa,"One table per class (`batch`, `debug`, `interactive`, `training`).\n\n")
out+=table('[group]','group','allocator/src/config.rs','GroupEntry',exa,"One `[[group]]` table per group of the org tree.\n\n")
open(root+'docs/reference/allotd.toml.md','w').write(out)
exg=examples('packaging/etc/agent.toml')
out="""# agent.toml reference

Every key allot-agent reads, by table, with its type and meaning as the code
documents it (the `example` column is the shipped `/etc/allot/agent.toml`; `—`: not
in it, the built-in default applies). A key not listed here is refused at start with
its line (`allot-agent --check-config`). `agent/src/config.rs` tests that every key
the parser accepts is listed here.

"""
out+=table('agent','agent','agent/src/config.rs','AgentSection',exg)
out+=table('health','health','health/src/config.rs','HealthConfig',exg)
open(root+'docs/reference/agent.toml.md','w').write(out)
