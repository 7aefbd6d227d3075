import { ConfigError } from '../errors.ts';

/**
 * A name → implementation registry looked up by a config string. An unknown name is a
 * ConfigError that lists the valid names (verl's core_algos registries behave the same way).
 */
export class Registry<T> {
  private readonly items = new Map<string, T>();
  constructor(
    readonly configKey: string,
    initial: Record<string, T> = {},
  ) {
    for (const [k, v] of Object.entries(initial)) this.items.set(k, v);
  }
  register(name: string, item: T): void {
    if (this.items.has(name)) throw new Error(`${this.configKey}: "${name}" is already registered`);
    this.items.set(name, item);
  }
  has(name: string): boolean {
    return this.items.has(name);
  }
  names(): string[] {
    return [...this.items.keys()].sort();
  }
  get(name: string): T {
    const item = this.items.get(name);
    if (item === undefined)
      throw new ConfigError(`unknown ${this.configKey} "${name}" — valid: ${this.names().join(', ')}`);
    return item;
  }
}
