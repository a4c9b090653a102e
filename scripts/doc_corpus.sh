#!/usr/bin/env bash
# A corpus of real English text for convergence runs (issue 28's bf16-vs-fp8 curves): the
# documentation that five Debian 12 packages ship, one document per source file, tokenized with
# GPT-2's BPE into DIR/docs_train and DIR/docs_valid (1% of the documents).
#   linux-doc-6.1      the kernel's reStructuredText (Documentation/**/*.rst.gz)
#   python3.11-doc     the reStructuredText sources of Python's manuals
#   perl-doc           Perl's POD manuals
#   git-doc            git's AsciiDoc manual pages
#   postgresql-doc-15  PostgreSQL's manual (HTML, tags stripped)
# Needs the network (apt-get download), python3 and a built myriad. Writes only under DIR.
#   scripts/doc_corpus.sh DIR [MYRIAD]
set -euo pipefail
dir=${1:?usage: scripts/doc_corpus.sh DIR [MYRIAD]}
myriad=$(realpath "${2:-build/myriad}")
mkdir -p "$dir/debs" "$dir/x"
cd "$dir/debs"
apt-get download linux-doc-6.1 python3.11-doc perl-doc git-doc postgresql-doc-15
for f in *.deb; do dpkg-deb -x "$f" ../x; done
cd ..
python3 - x docs.jsonl <<'PY'
import glob, gzip, html.parser, json, os, sys
root, out = sys.argv[1], sys.argv[2]
class Text(html.parser.HTMLParser):
    def __init__(s): super().__init__(); s.parts, s.skip = [], 0
    def handle_starttag(s, tag, a): s.skip += tag in ("script", "style")
    def handle_endtag(s, tag): s.skip -= tag in ("script", "style")
    def handle_data(s, d): s.parts.append("" if s.skip else d)
def html_text(raw):
    p = Text(); p.feed(raw); return "".join(p.parts)
sources = [  # (glob under root, reader)
    ("usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz", lambda p: gzip.open(p, "rt", errors="replace").read()),
    ("usr/share/doc/python3.11/html/_sources/**/*.txt", lambda p: open(p, errors="replace").read()),
    ("usr/share/perl/*/pod/*.pod", lambda p: open(p, errors="replace").read()),
    ("usr/share/doc/git-doc/*.txt", lambda p: open(p, errors="replace").read()),
    ("usr/share/doc/postgresql-doc-15/html/*.html", lambda p: html_text(open(p, errors="replace").read())),
]
n = size = 0
with open(out, "w") as f:
    for pattern, read in sources:
        for p in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            text = read(p)
            if text.strip():
                f.write(json.dumps({"text": text}) + "\n"); n += 1; size += len(text)
print(f"{n} documents, {size / 1e6:.1f} M characters in {out}")
PY
"$myriad" prepare --input docs.jsonl --tokenizer gpt2 --output docs --valid-fraction 0.01
