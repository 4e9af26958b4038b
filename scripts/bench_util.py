"""What the latency scripts share: `nerve serve` started on a free port, its API by urllib, and the
fine-tuning scripts' chat examples."""
import argparse, json, os, re, subprocess, sys, tempfile, time, urllib.request


def parser():  # the options every latency script takes
    ap = argparse.ArgumentParser()
    ap.add_argument('--nerve', default='build/nerve')
    ap.add_argument('--model')
    ap.add_argument('--tok', default=os.path.join(os.environ.get('NERVE_DATA', '../shared/data'), 'tokenizers/tokenizer.bin'))
    ap.add_argument('--probes', type=int, default=8)
    return ap


def day_examples(n):  # n chat examples of one pattern, OpenAI's fine-tuning format, as an upload's bytes
    return ''.join(json.dumps({'messages': [{'role': 'user', 'content': f'Tell me about day {i} of the week.'},
                                            {'role': 'assistant', 'content': f'Day {i} was sunny and the children played in the park.'}]})
                   + '\n' for i in range(n)).encode()


class Server:
    def __init__(self, nerve, model, tok, args, prefix_cache=False):  # args: serve's options, '{tmp}' in them a folder of the run's own
        self.tmp = tempfile.mkdtemp()
        args = [x.replace('{tmp}', self.tmp) for x in args]
        if not model:  # a stories15M-shaped model of random weights
            model = os.path.join(self.tmp, 's15.bin')
            subprocess.run([nerve, 'init', '--preset', 'stories15M', '-o', model], check=True, stderr=subprocess.DEVNULL)
        self.log = open(os.path.join(self.tmp, 'serve.log'), 'w+')
        self.proc = subprocess.Popen([nerve, 'serve', '-m', model, '-z', tok, '--port', '0', '--kv-disk-cache', '0']
                                     + ([] if prefix_cache else ['--no-prefix-cache']) + args, stderr=self.log)
        port = None
        for _ in range(600):
            time.sleep(0.1)
            self.log.seek(0)
            m = re.search(r'listening on http://127.0.0.1:(\d+)', self.log.read())
            if m:
                port = int(m.group(1))
                break
        if not port:
            sys.exit('the server did not start: ' + open(self.log.name).read())
        self.base = f'http://127.0.0.1:{port}'

    def post(self, path, body, ctype='application/json'):
        req = urllib.request.Request(self.base + path, data=body if isinstance(body, bytes) else json.dumps(body).encode(),
                                     headers={'Content-Type': ctype})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=60) as r:
            return json.loads(r.read())

    def upload(self, purpose, data):  # POST /v1/files: the new file's id
        bnd = 'XyZbench'
        mp = (f'--{bnd}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n--{bnd}\r\nContent-Disposition: '
              f'form-data; name="file"; filename="data.jsonl"\r\n\r\n').encode() + data + f'\r\n--{bnd}--\r\n'.encode()
        return self.post('/v1/files', mp, f'multipart/form-data; boundary={bnd}')['id']

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
